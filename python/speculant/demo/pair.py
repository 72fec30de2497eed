"""The demo's default target / draft pair: two byte-level TinyGPTs trained on Python's own standard library.

The pair ships with the package: its weights are safetensors files in ``speculant/demo/weights/`` beside
``pair.json``, the record of how they were made (the recipe, the corpus's sha256, the held-out losses and α, the
training seconds, the files' sha256). ``default_pair()`` turns them into the engine's TorchScript files in
about a second, without training, and caches those under
``${SPECULANT_CACHE:-~/.cache/speculant}/models/shipped-<hash>/`` (target.pt, draft.pt, pair.json; the hash
covers the weights and the torch version, so two torches never share a TorchScript file).

The recipe stays runnable. ``python -m speculant.demo.pair --train`` trains the pair again and writes the three
files (about 3 minutes on 2 idle cores, much longer on busy ones). The corpus exists wherever Python does
(``sysconfig.get_paths()["stdlib"]``, top-level *.py modules, sorted by name) and the tokenizer is plain UTF-8
bytes (vocab 256), so nothing is downloaded. Seeds fix the initialisation and the batch order; the
floating-point trajectory still depends on the CPU and the thread count, so pair.json records what the
training machine got. ``default_pair(recipe=...)`` with another recipe (a test's ``DEFAULT_RECIPE.smoke()``)
trains that recipe and caches it under ``models/<recipe hash>/``. Training or converting holds an exclusive lock
(fcntl.flock on ``models/<name>.lock``): of several first runs at once one works, and the others wait for it and
then read its files, which are complete (each is written to a temp file and renamed into place, pair.json
last).

α is the paper's expected acceptance rate (Leviathan et al. 2023, Corollary 3.6): the mean over held-out
positions of Σ_x min(p(x), q(x)) with p = target M_p and q = draft M_q at temperature 1.

    python -m speculant.demo.pair                 # the shipped pair's record (pair.json)
    python -m speculant.demo.pair --train         # train the recipe and write the weights and pair.json
"""
import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import math
import os
import sys
import sysconfig
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor

from ..decoding.sampling import beta
from ..models.tiny_gpt import TinyGPT, TinyGPTConfig, script_cached

__all__ = ["TrainConfig", "Recipe", "DEFAULT_RECIPE", "WEIGHTS", "encode", "decode", "load_corpus", "train",
           "evaluate", "train_pair", "save_pair", "read_record", "load_models", "cache_root", "default_pair"]

_FORMAT = 4  # bump when the files or the training code change meaning, so old caches are not reused (2: batched
# calls, 3: tree calls, 4: the shipped pair)


def encode(text: str) -> List[int]:
    """UTF-8 bytes of `text`, each a token in [0, 256)."""
    return list(text.encode("utf-8"))


def decode(tokens: Iterable[int]) -> str:
    """Inverse of `encode`; bytes that are not valid UTF-8 (a cut multi-byte character) become U+FFFD."""
    return bytes(tokens).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int  # sequences of max_length + 1 bytes per step
    lr: float  # AdamW peak learning rate
    warmup: int = 20  # linear warmup steps, then cosine decay to lr * min_lr_ratio
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1  # on weight matrices and embeddings; never on biases or LayerNorm gains
    seed: int = 0  # initialisation and batch sampling


@dataclass(frozen=True)
class Recipe:
    target: TinyGPTConfig
    draft: TinyGPTConfig
    target_train: TrainConfig
    draft_train: TrainConfig
    holdout_every: int = 16  # every 16th module (sorted by name) is held out for the losses and α
    eval_windows: int = 48  # held-out windows of max_length bytes for the losses and α

    def smoke(self, steps: int = 2) -> "Recipe":
        """Same models and code path, a handful of tiny steps: for tests of the recipe itself."""
        small = dict(steps=steps, batch_size=2, warmup=1)
        return dataclasses.replace(self, target_train=dataclasses.replace(self.target_train, **small),
                                   draft_train=dataclasses.replace(self.draft_train, **small), eval_windows=2)


# Sized for ~3 minutes on 2 idle CPU cores (torch's default threads; cores shared with other work take much
# longer). On that budget the step count, not the width, decides quality: a 4-layer d_model 256 target gets ~180
# steps of batch 16 and stays at bigram level (held-out 2.7 nats/byte), while d_model 128 at batch 4 gets 2300
# steps and learns to copy from its context (1.9; a trigram count table scores 2.2). For the same reason the
# target's MLP is 2 * d_model wide (at 4x the MLP is 2/3 of a block's FLOPs; 1700 steps at 4x reach only 2.0), and
# the 1-layer draft is d_model 64 with 2000 steps of batch 8 rather than d_model 96 with fewer (α 0.77 vs 0.64
# against the same target). A 3-layer target trains to 1.8 in the same time, but per call it costs 3 layers of
# overhead against the draft's 1.
DEFAULT_RECIPE = Recipe(
    target=TinyGPTConfig(vocab_size=256, n_layer=4, n_head=4, d_model=128, max_length=256, d_ff=256),
    draft=TinyGPTConfig(vocab_size=256, n_layer=1, n_head=2, d_model=64, max_length=256),
    target_train=TrainConfig(steps=2300, batch_size=4, lr=3e-3, seed=2),
    draft_train=TrainConfig(steps=2000, batch_size=8, lr=3e-3, seed=3),
)


def load_corpus(holdout_every: int = DEFAULT_RECIPE.holdout_every) -> Tuple[Tensor, Tensor, str]:
    """(train bytes [N], held-out bytes [N_val], sha256 of both) from the stdlib's top-level *.py modules."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"), key=lambda p: p.name)
    parts: Tuple[List[bytes], List[bytes]] = ([], [])
    digest = hashlib.sha256()
    for i, path in enumerate(files):
        data = path.read_bytes()
        parts[i % holdout_every == holdout_every - 1].append(data)
        digest.update(path.name.encode() + b"\0" + data + b"\0")
    train_bytes, val_bytes = (b"\n".join(p) for p in parts)
    as_tensor = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8).long()  # [N]
    return as_tensor(train_bytes), as_tensor(val_bytes), digest.hexdigest()


def _lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def train(config: TinyGPTConfig, tokens: Tensor, schedule: TrainConfig, *, progress: bool = True,
          desc: str = "train") -> TinyGPT:
    """Next-byte training on random windows of `tokens` [N]: AdamW, warmup + cosine decay, seeded."""
    from tqdm.auto import tqdm

    with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's global RNG
        torch.manual_seed(schedule.seed)
        model = TinyGPT(config)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": schedule.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=schedule.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(schedule.seed)
    T = config.max_length
    offsets = torch.arange(T + 1)  # [T + 1]
    bar = tqdm(range(schedule.steps), desc=desc, disable=not progress)
    for step in bar:
        starts = torch.randint(0, tokens.numel() - T - 1, (schedule.batch_size, 1), generator=gen)  # [B, 1]
        window = tokens[starts + offsets]  # [B, T + 1]
        logits = model(window[:, :-1])  # [B, T, V]
        loss = F.cross_entropy(logits.flatten(0, 1), window[:, 1:].flatten())
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, schedule)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    return model.eval()


@torch.no_grad()
def evaluate(target: TinyGPT, draft: TinyGPT, tokens: Tensor, windows: int) -> dict:
    """Held-out losses (nats per byte) and α = mean Σ_x min(p, q) at temperature 1 (Corollary 3.6), with a
    unigram "draft" (byte frequencies of the same text) as the trivial baseline."""
    T = min(target.config.max_length, draft.config.max_length)
    starts = torch.linspace(0, tokens.numel() - T - 1, windows).long()  # [W], evenly spread, deterministic
    window = tokens[starts[:, None] + torch.arange(T + 1)]  # [W, T + 1]
    x, y = window[:, :-1], window[:, 1:].flatten()  # [W, T], [W * T]
    p = target(x).flatten(0, 1).float().softmax(-1)  # [W * T, V]
    q = draft(x).flatten(0, 1).float().softmax(-1)  # [W * T, V]
    unigram = torch.bincount(tokens, minlength=p.size(1)).float() / tokens.numel()  # [V]
    nll = lambda probs: -probs.gather(1, y[:, None]).clamp_min(1e-30).log().mean().item()
    return {
        "target_loss": nll(p), "draft_loss": nll(q),
        "alpha": beta(p, q).mean().item(),
        "alpha_unigram_baseline": beta(p, unigram).mean().item(),
        "greedy_agreement": (p.argmax(-1) == q.argmax(-1)).float().mean().item(),
        "eval_positions": y.numel(),
    }


WEIGHTS = Path(__file__).parent / "weights"  # the shipped pair (package data)
RETRAIN = "python -m speculant.demo.pair --train"
NAMES = ("target", "draft")


def cache_root() -> Path:
    return Path(os.environ.get("SPECULANT_CACHE") or Path.home() / ".cache" / "speculant")


def _atomic_write(path: Path, write) -> None:
    # write a sibling temp file, then rename it over `path`: an interrupted run leaves no half file there
    tmp = str(path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"))
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def train_pair(recipe: Recipe = DEFAULT_RECIPE, progress: bool = True) -> Tuple[dict, dict]:
    """Trains ``recipe``'s target and draft; returns ({"target": TinyGPT, "draft": TinyGPT}, record), the record
    being what pair.json holds: the recipe, the corpus's sha256, the held-out losses and α, the seconds."""
    train_tokens, val_tokens, corpus_sha = load_corpus(recipe.holdout_every)
    seconds, models = {}, {}
    for name, config, schedule in (("target", recipe.target, recipe.target_train),
                                   ("draft", recipe.draft, recipe.draft_train)):
        start = time.perf_counter()
        models[name] = train(config, train_tokens, schedule, progress=progress, desc=f"speculant demo {name}")
        seconds[name] = time.perf_counter() - start
    record = {"format": _FORMAT, "recipe": dataclasses.asdict(recipe), "corpus_sha256": corpus_sha,
              **evaluate(models["target"], models["draft"], val_tokens, recipe.eval_windows),
              "train_seconds": seconds, "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
              "python": sys.version.split()[0],
              "params": {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()},
              "corpus_bytes": {"train": train_tokens.numel(), "heldout": val_tokens.numel()}}
    return models, record


def _write_json(path: Path, record: dict) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(record, f, indent=2)
            f.write("\n")

    _atomic_write(path, write)


def save_pair(models: dict, record: dict, directory: os.PathLike) -> Path:
    """Writes target.safetensors, draft.safetensors and pair.json (the record with the files' sha256) into
    ``directory``; returns it."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    hashes = {}
    for name in NAMES:
        path = out / f"{name}.safetensors"
        state = {key: value.detach().contiguous() for key, value in models[name].state_dict().items()}
        _atomic_write(path, lambda tmp, s=state: save_file(s, tmp))
        path.chmod(0o644)  # readable by all, as a package's files are
        hashes[name] = _sha256(path)
    _write_json(out / "pair.json", {**record, "sha256": hashes})
    return out


def read_record(directory: os.PathLike = WEIGHTS) -> dict:
    """The pair.json of a pair written by save_pair (by default the shipped one), its files checked against the
    sha256 it records. FileNotFoundError naming the missing file and how to make it again; ValueError for a file
    that is not the one the record describes."""
    directory = Path(directory)
    missing = [p for p in [directory / "pair.json", *(directory / f"{n}.safetensors" for n in NAMES)] if not p.exists()]
    if missing:
        raise FileNotFoundError(
            f"the demo pair's weights are missing: {', '.join(str(p) for p in missing)}. They ship with the "
            f"package (speculant/demo/weights/): reinstall speculant, or train them again with `{RETRAIN}` "
            "(about 3 minutes on 2 idle cores, much longer on busy ones)")
    record = json.loads((directory / "pair.json").read_text())
    for name in NAMES:
        path = directory / f"{name}.safetensors"
        if _sha256(path) != record["sha256"][name]:
            raise ValueError(f"{path} is not the file {directory / 'pair.json'} records (sha256 differs): "
                             f"reinstall speculant, or train the pair again with `{RETRAIN}`")
    return record


def load_models(directory: os.PathLike = WEIGHTS) -> Tuple[dict, dict]:
    """({"target": TinyGPT, "draft": TinyGPT}, record) from a pair written by save_pair (default: the shipped
    one), with the configurations its record names."""
    record = read_record(directory)
    models = {}
    for name in NAMES:
        model = TinyGPT(TinyGPTConfig(**record["recipe"][name]))
        model.load_state_dict(load_file(str(Path(directory) / f"{name}.safetensors")))
        models[name] = model.eval()
    return models, record


def default_pair(progress: bool = True, *, recipe: Recipe = DEFAULT_RECIPE,
                 cache_dir: Optional[os.PathLike] = None, weights: Optional[os.PathLike] = None) -> Tuple[Path, Path]:
    """(target_path, draft_path): the demo pair as TorchScript files, under <cache_dir>/models/ (cache_dir
    defaults to cache_root()).

    With the default recipe, the shipped weights (or those in ``weights``, a directory save_pair wrote) are
    converted, never trained: about a second. Another recipe is trained (a smoke recipe in seconds, the full one
    in minutes) and cached by its hash. pair.json is written last and marks a directory complete. While one call
    works, others for the same pair (threads or processes) wait on its lock file and then return its files.
    """
    if weights is not None and recipe != DEFAULT_RECIPE:
        raise ValueError("default_pair: pass weights= (a trained pair) or recipe= (a pair to train), not both")
    root = Path(cache_dir if cache_dir is not None else cache_root()) / "models"
    if recipe == DEFAULT_RECIPE:
        directory = Path(WEIGHTS if weights is None else weights)
        hashes = read_record(directory)["sha256"]
        key = json.dumps({"format": _FORMAT, "sha256": hashes, "torch": torch.__version__}, sort_keys=True)
        name = "shipped-" + hashlib.sha256(key.encode()).hexdigest()[:16]
        make = lambda: load_models(directory)
    else:
        _, _, corpus_sha = load_corpus(recipe.holdout_every)
        spec = {"format": _FORMAT, "recipe": dataclasses.asdict(recipe), "corpus_sha256": corpus_sha}
        name = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
        make = lambda: train_pair(recipe, progress)
    out = root / name
    target_path, draft_path, info_path = out / "target.pt", out / "draft.pt", out / "pair.json"
    complete = lambda: info_path.exists() and target_path.exists() and draft_path.exists()
    if complete():
        return target_path, draft_path
    out.mkdir(parents=True, exist_ok=True)
    with _exclusive(root / f"{name}.lock", progress):
        if not complete():  # else another call made the pair while this one waited
            models, record = make()
            for path, model in ((target_path, models["target"]), (draft_path, models["draft"])):
                _atomic_write(path, lambda tmp, m=model: torch.jit.save(script_cached(m), tmp))
            _write_json(info_path, record)
    return target_path, draft_path


@contextlib.contextmanager
def _exclusive(lock_path: Path, progress: bool) -> Iterator[None]:
    """Holds an exclusive flock on `lock_path` (created if missing, never deleted: deleting it would let a
    waiter lock a file that a newcomer no longer opens). The lock goes with the open file description, so it
    excludes threads of one process as well as processes, and dies with a killed process."""
    with open(lock_path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                print(f"speculant: another process is making the demo pair ({lock_path}); waiting for it",
                      file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m speculant.demo.pair",
                                     description="The demo pair: print its record, or train it again.")
    parser.add_argument("--train", action="store_true",
                        help="train the recipe (about 3 minutes on 2 idle cores) and write the weights")
    parser.add_argument("--out", default=str(WEIGHTS), help="where --train writes (default: %(default)s)")
    parser.add_argument("--smoke", action="store_true", help="with --train: 2 tiny steps per model (a test)")
    args = parser.parse_args(argv)
    if args.smoke and not args.train:
        parser.error("--smoke goes with --train")
    if args.train:
        recipe = DEFAULT_RECIPE.smoke() if args.smoke else DEFAULT_RECIPE
        models, record = train_pair(recipe, progress=True)
        out = save_pair(models, record, args.out)
    else:
        out = Path(args.out)
    print(json.dumps(read_record(out), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
