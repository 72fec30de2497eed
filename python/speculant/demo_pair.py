"""The demo's default target / draft pair: two byte-level TinyGPTs trained on Python's own standard library.

The corpus exists wherever Python does (`sysconfig.get_paths()["stdlib"]`, top-level *.py modules, sorted
by name) and the tokenizer is plain UTF-8 bytes (vocab 256), so `default_pair()` builds the pair anywhere
without a download. Seeds fix the initialisation and the batch order; the floating-point trajectory still
depends on the CPU and the thread count (held-out losses moved by ~0.06 nats between 1 and 2 threads), so
pair.json records what this machine got. The result is cached under
`${SPECULANT_CACHE:-~/.cache/speculant}/models/<recipe hash>/` as target.pt and draft.pt (TorchScript,
cached form, see tiny_gpt.py) and pair.json (sizes, held-out losses, α, training seconds). The hash covers
the recipe and the corpus bytes, so a different Python (a different stdlib) gets its own directory. Training
holds an exclusive lock (fcntl.flock on models/<recipe hash>.lock): of several first runs at once one trains,
and the others wait for it and then read its files, which are complete (each is written to a temp file and
renamed into place, pair.json last).

α is the paper's expected acceptance rate (Leviathan et al. 2023, Corollary 3.6): the mean over held-out
positions of Σ_x min(p(x), q(x)) with p = target M_p and q = draft M_q at temperature 1.

    python -m speculant.demo_pair          # train (or find) the pair and print pair.json
"""
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
from torch import Tensor

from .tiny_gpt import TinyGPT, TinyGPTConfig, script_cached

__all__ = ["TrainConfig", "Recipe", "DEFAULT_RECIPE", "encode", "decode", "load_corpus", "train", "evaluate",
           "cache_root", "default_pair"]

_FORMAT = 3  # bump when the files or the training code change meaning, so old caches are not reused (2: batched
# calls, 3: tree calls)


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
        "alpha": torch.minimum(p, q).sum(-1).mean().item(),
        "alpha_unigram_baseline": torch.minimum(p, unigram).sum(-1).mean().item(),
        "greedy_agreement": (p.argmax(-1) == q.argmax(-1)).float().mean().item(),
        "eval_positions": y.numel(),
    }


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


def default_pair(progress: bool = True, *, recipe: Recipe = DEFAULT_RECIPE,
                 cache_dir: Optional[os.PathLike] = None) -> Tuple[Path, Path]:
    """(target_path, draft_path) of the demo pair, training it first (~3 min on 2 idle cores) if not cached.

    cache_dir defaults to cache_root(); the files go to <cache_dir>/models/<recipe hash>/. pair.json is
    written last and marks the directory complete. While one call trains, others for the same pair (threads or
    processes) wait on <cache_dir>/models/<recipe hash>.lock and then return its files.
    """
    train_tokens, val_tokens, corpus_sha = load_corpus(recipe.holdout_every)
    spec = {"format": _FORMAT, "recipe": dataclasses.asdict(recipe), "corpus_sha256": corpus_sha}
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    out = Path(cache_dir if cache_dir is not None else cache_root()) / "models" / key
    target_path, draft_path, info_path = out / "target.pt", out / "draft.pt", out / "pair.json"
    complete = lambda: info_path.exists() and target_path.exists() and draft_path.exists()
    if complete():
        return target_path, draft_path

    out.mkdir(parents=True, exist_ok=True)
    with _exclusive(out.parent / f"{key}.lock", progress):
        if not complete():  # else another call trained the pair while this one waited
            _train_pair(recipe, spec, train_tokens, val_tokens, target_path, draft_path, info_path, progress)
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
                print(f"speculant: another process is training the demo pair ({lock_path}); waiting for it",
                      file=sys.stderr, flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _train_pair(recipe: Recipe, spec: dict, train_tokens: Tensor, val_tokens: Tensor, target_path: Path,
                draft_path: Path, info_path: Path, progress: bool) -> None:
    seconds = {}
    models = {}
    for name, config, schedule in (("target", recipe.target, recipe.target_train),
                                   ("draft", recipe.draft, recipe.draft_train)):
        start = time.perf_counter()
        models[name] = train(config, train_tokens, schedule, progress=progress, desc=f"speculant demo {name}")
        seconds[name] = time.perf_counter() - start
    metrics = evaluate(models["target"], models["draft"], val_tokens, recipe.eval_windows)
    for name, path in (("target", target_path), ("draft", draft_path)):
        _atomic_write(path, lambda tmp, m=models[name]: torch.jit.save(script_cached(m), tmp))
    info = {**spec, **metrics, "train_seconds": seconds, "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "params": {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()},
            "corpus_bytes": {"train": train_tokens.numel(), "heldout": val_tokens.numel()}}

    def write_info(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(info, f, indent=2)

    _atomic_write(info_path, write_info)


if __name__ == "__main__":
    target, draft = default_pair()
    print(json.dumps(json.loads((target.parent / "pair.json").read_text()), indent=2))
