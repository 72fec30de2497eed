"""Real model pairs for the benchmarks, trained here on text every machine has (no downloads): a byte-level BPE
tokenizer, a GPT-2-architecture target / draft pair and a T5 target / draft pair, all on Python's own standard
library, saved as transformers `save_pretrained` directories and exported with `speculant.export`, as a
researcher's own models would be.

    python benchmarks/train_pairs.py                        # both pairs, CPU preset (~15 + ~5 min on 2 cores)
    python benchmarks/train_pairs.py --stage gpt2-target    # one stage at a time (each is cached)
    python benchmarks/train_pairs.py --preset cuda --device cuda   # the paper's 97M / 6M GPT-like shapes
    python benchmarks/train_pairs.py --stage gpt2-sibling   # a sibling draft beside the GPT-2 pair's draft

Corpus (as `speculant.demo_pair`): the stdlib's *.py modules sorted by name, every 16th module held out; the
CPU preset uses the top-level modules (4.7 MB on Python 3.11), the CUDA preset every module under the stdlib
(about 128 MB). The tokenizer is a byte-level BPE (`tokenizers`) trained on the training modules; the target
and draft of a pair share it (speculative decoding needs one vocabulary).

* GPT-2 pair (GPT2LMHeadModel): next-token training on random windows of the concatenated modules (each ends
  with </s>). The paper's GPT-like pair (§4.2) is a 12-layer d=768 target (97M) with a 2-layer d=256 draft
  (6M); the CPU preset keeps the draft's shape in spirit and scales the target down so that both train in
  about 15 minutes on 2 cores.
* T5 pair (T5ForConditionalGeneration): a sequence-to-sequence task from the same modules: the source is a
  block of up to 4 consecutive non-blank lines, the target the next block of up to 4 lines, then </s>.
* A sibling draft for the GPT-2 pair (`--stage gpt2-sibling`, after the pair; not part of the default): a copy of
  the draft trained by `speculant.distill(..., loss="residual", beside=the draft)` at T = 1 on windows of the
  training stream (SIBLING below), saved as sibling/ and sibling.pt with sibling.json: the law a token tree's
  later children are drawn from (SpeculativeDecoder's sibling_draft=, cpp/math/tree.h).

Every stage is seeded (initialisation and batch order) and cached under
`${SPECULANT_CACHE:-~/.cache/speculant}/bench/<pair>-<recipe hash>/`: tokenizer.json, target/ and draft/
(save_pretrained directories with the tokenizer), target.pt and draft.pt (speculant.export), one
<role>.json per model (parameters, held-out loss, training seconds, threads) and pair.json (all of it) written
last. The hash covers the pair's recipe, the format and the corpus bytes. Floating-point trajectories still
depend on the CPU and the thread count, so the json files record what this machine got.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

import speculant
from speculant.demo_pair import cache_root

FORMAT = 1  # bump when files or training code change meaning, so that old caches are not reused
SPECIALS = ["<pad>", "</s>", "<unk>"]  # ids 0, 1, 2: T5's pad (= decoder start), EOS, unknown
PAD, EOS = 0, 1


@dataclass(frozen=True)
class Schedule:
    steps: int
    batch_size: int  # sequences per step
    lr: float  # AdamW peak learning rate; linear warmup, then cosine decay to lr * min_lr_ratio
    warmup: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1  # matrices and embeddings only
    seed: int = 0  # initialisation and batch order


@dataclass(frozen=True)
class Recipe:
    """One pair: its corpus, tokenizer, two model configs (transformers config kwargs) and schedules."""
    kind: str  # "gpt2", "llama" or "t5"
    target: Dict  # GPT2Config / LlamaConfig / T5Config kwargs (vocab_size and special ids are added)
    draft: Dict
    target_train: Schedule
    draft_train: Schedule
    vocab_size: int = 4096  # BPE vocabulary, specials included
    context: int = 256  # GPT-2: training window and n_positions; T5: longest source / target in tokens
    corpus: str = "toplevel"  # "toplevel": Lib/*.py; "all": every *.py under the stdlib
    holdout_every: int = 16
    eval_batches: int = 16  # held-out batches (of the training batch size, fixed) for the reported losses
    max_files: int = 0  # 0 = all; the smoke recipe uses a few files

    def smoke(self) -> "Recipe":
        """The same code path on tiny models, corpus and step counts: for tests of the recipe itself."""
        tiny = {"gpt2": dict(n_layer=1, n_embd=32, n_head=2, n_inner=64),
                "llama": dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, num_key_value_heads=2,
                              intermediate_size=64),
                "t5": dict(d_model=32, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=2, d_kv=16)}[self.kind]
        schedule = Schedule(steps=2, batch_size=2, lr=1e-3, warmup=1)
        return dataclasses.replace(self, target={**self.target, **tiny}, draft={**self.draft, **tiny},
                                   target_train=schedule, draft_train=dataclasses.replace(schedule, seed=1),
                                   vocab_size=300, context=64, eval_batches=1, max_files=8, holdout_every=4)


# CPU presets: sized on the project's 2-core VM (torch 2 threads); BENCHMARKS.md has the sizes and losses they
# reach. The target is scaled down from 12 x 768 to 6 x 384 (12.3M): a training step of 8 x 256 tokens takes
# 1.3 s there, so 500 steps fill ~11 minutes (one pass over ~2/3 of the corpus). The draft keeps the paper's
# draft in spirit at 1 layer of d=128 (0.76M): on a CPU a call's fixed cost dominates at this size, and its
# single-token call costs 0.07 of the target's. Both see the same 500 batches' worth of tokens.
GPT2_CPU = Recipe(
    kind="gpt2",
    target=dict(n_layer=6, n_embd=384, n_head=6, n_inner=1536, activation_function="gelu_new"),
    draft=dict(n_layer=1, n_embd=128, n_head=2, n_inner=512, activation_function="gelu_new"),
    target_train=Schedule(steps=500, batch_size=8, lr=2e-3, warmup=30, seed=10),
    draft_train=Schedule(steps=500, batch_size=8, lr=3e-3, warmup=30, seed=11),
    context=256,
)
# The paper's GPT-like pair (§4.2): target dim 768, ff 3072, 12 layers, 12 heads (97M with an 8k vocabulary);
# draft dim 256, ff 1024, 2 layers, 4 heads (6M). Meant for a CUDA GPU (--device cuda); not run on the VM.
GPT2_CUDA = Recipe(
    kind="gpt2",
    target=dict(n_layer=12, n_embd=768, n_head=12, n_inner=3072, activation_function="gelu_new"),
    draft=dict(n_layer=2, n_embd=256, n_head=4, n_inner=1024, activation_function="gelu_new"),
    target_train=Schedule(steps=20000, batch_size=32, lr=6e-4, warmup=500, seed=10),
    draft_train=Schedule(steps=20000, batch_size=32, lr=1e-3, warmup=500, seed=11),
    vocab_size=8192, context=512, corpus="all",
)
# A Llama-architecture target (6 x 256, SwiGLU 768, grouped-query attention), for drafts that need a transformers
# model whose forward honours config.num_hidden_layers (transformers' early exit: benchmarks/feature_drafts.py). A
# training step of 8 x 256 tokens takes about 1.1 s on the 2-core VM, so 300 steps fill ~6 minutes. Its draft
# stage is the GPT-2 draft's shape in Llama form.
LLAMA_CPU = Recipe(
    kind="llama",
    target=dict(num_hidden_layers=6, hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=768),
    draft=dict(num_hidden_layers=1, hidden_size=128, num_attention_heads=2, num_key_value_heads=2,
               intermediate_size=384),
    target_train=Schedule(steps=300, batch_size=8, lr=2e-3, warmup=30, seed=40),
    draft_train=Schedule(steps=500, batch_size=8, lr=3e-3, warmup=30, seed=41),
    context=256,
)
T5_CPU = Recipe(
    kind="t5",
    target=dict(d_model=256, d_ff=1024, num_layers=4, num_decoder_layers=4, num_heads=4, d_kv=64,
                feed_forward_proj="relu"),
    draft=dict(d_model=128, d_ff=512, num_layers=1, num_decoder_layers=1, num_heads=2, d_kv=64,
               feed_forward_proj="relu"),
    target_train=Schedule(steps=500, batch_size=16, lr=2e-3, seed=20),
    draft_train=Schedule(steps=500, batch_size=16, lr=3e-3, seed=21),
    context=64,
)
T5_CUDA = dataclasses.replace(
    T5_CPU, target=dict(T5_CPU.target, d_model=512, d_ff=2048, num_layers=8, num_decoder_layers=8, num_heads=8),
    target_train=Schedule(steps=20000, batch_size=64, lr=1e-3, warmup=500, seed=20),
    draft_train=Schedule(steps=20000, batch_size=64, lr=1e-3, warmup=500, seed=21),
    vocab_size=8192, corpus="all")
def _steps(recipe: Recipe, steps: int) -> Recipe:
    return dataclasses.replace(recipe, **{f"{role}_train": dataclasses.replace(
        getattr(recipe, f"{role}_train"), steps=steps, warmup=steps // 10) for role in ("target", "draft")})


# The CUDA shapes trained for a lent GPU's lease (15 minutes of device time for building, testing and measuring
# together): 1,000 steps each, about two minutes for the target with TF32 on an H100. A weaker pair than the
# paper's (lower alpha), the same call costs.
PRESETS = {"cpu": {"gpt2": GPT2_CPU, "t5": T5_CPU}, "cuda": {"gpt2": GPT2_CUDA, "t5": T5_CUDA},
           "lease": {"gpt2": _steps(GPT2_CUDA, 1000), "t5": _steps(T5_CUDA, 1000)}}


# ----------------------------------------------------------------------------------------------------------
# corpus and tokenizer
# ----------------------------------------------------------------------------------------------------------


def load_corpus(recipe: Recipe) -> Tuple[List[str], List[str], str]:
    """(training module texts, held-out module texts, sha256 over names and bytes), sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(root.glob("*.py") if recipe.corpus == "toplevel" else
                   (p for p in root.rglob("*.py") if "site-packages" not in p.parts),
                   key=lambda p: str(p.relative_to(root)))
    if recipe.max_files:
        files = files[:recipe.max_files]
    parts: Tuple[List[str], List[str]] = ([], [])
    digest = hashlib.sha256()
    for i, path in enumerate(files):
        data = path.read_bytes()
        digest.update(str(path.relative_to(root)).encode() + b"\0" + data + b"\0")
        parts[i % recipe.holdout_every == recipe.holdout_every - 1].append(data.decode("utf-8", errors="replace"))
    return parts[0], parts[1], digest.hexdigest()


def train_tokenizer(texts: Sequence[str], vocab_size: int):
    """A byte-level BPE (GPT-2's pre-tokenization, no prefix space) with SPECIALS at ids 0, 1, 2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def load_tokenizer(path: os.PathLike):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.fspath(path))


def stream(tokenizer, texts: Sequence[str]) -> torch.Tensor:
    """[N] token ids of the modules, each followed by </s>."""
    ids: List[int] = []
    for encoding in tokenizer.encode_batch(list(texts)):
        ids.extend(encoding.ids)
        ids.append(EOS)
    return torch.tensor(ids, dtype=torch.long)


def line_pairs(tokenizer, texts: Sequence[str], context: int, lines: int = 4) -> List[Tuple[List[int], List[int]]]:
    """The T5 task: (block of up to `lines` non-blank lines, the next block + </s>), both cut to `context`
    tokens (the target keeps its </s>). Consecutive blocks of each module, in order."""
    sources, targets = [], []
    for text in texts:
        rows = [r for r in text.splitlines() if r.strip()]
        blocks = ["\n".join(rows[i:i + lines]) for i in range(0, len(rows), lines)]
        for a, b in zip(blocks, blocks[1:]):
            sources.append(a)
            targets.append(b)
    pairs = []
    for s, t in zip(tokenizer.encode_batch(sources), tokenizer.encode_batch(targets)):
        pairs.append((s.ids[:context], t.ids[:context - 1] + [EOS]))
    return pairs


# ----------------------------------------------------------------------------------------------------------
# models and training
# ----------------------------------------------------------------------------------------------------------


def make_model(recipe: Recipe, role: str, seed: int):
    import transformers

    kwargs = dict(getattr(recipe, role))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if recipe.kind == "gpt2":
            config = transformers.GPT2Config(vocab_size=recipe.vocab_size, n_positions=recipe.context,
                                             bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD,
                                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **kwargs)
            model = transformers.GPT2LMHeadModel(config)
        elif recipe.kind == "llama":
            config = transformers.LlamaConfig(vocab_size=recipe.vocab_size, max_position_embeddings=recipe.context,
                                              bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD, **kwargs)
            model = transformers.LlamaForCausalLM(config)
        else:
            config = transformers.T5Config(vocab_size=recipe.vocab_size, pad_token_id=PAD, eos_token_id=EOS,
                                           decoder_start_token_id=PAD, dropout_rate=0.0,
                                           tie_word_embeddings=True, **kwargs)
            model = transformers.T5ForConditionalGeneration(config)
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = PAD
    if recipe.kind == "t5":
        model.generation_config.decoder_start_token_id = PAD
    return model


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights counted once


def _lr_at(step: int, s: Schedule) -> float:
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    progress = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


class Batches:
    """Seeded batches: windows of the token stream (GPT-2) or padded (source, target) pairs (T5)."""

    def __init__(self, recipe: Recipe, data, seed: int, device: torch.device):
        self.recipe, self.data, self.device = recipe, data, device
        self.gen = torch.Generator().manual_seed(seed)

    def sample(self, batch_size: int) -> Dict[str, torch.Tensor]:
        if self.recipe.kind != "t5":
            T = self.recipe.context
            starts = torch.randint(0, self.data.numel() - T - 1, (batch_size, 1), generator=self.gen)
            return window_batch(self.data, starts, T, self.device)
        index = torch.randint(0, len(self.data), (batch_size,), generator=self.gen).tolist()
        return pair_batch([self.data[i] for i in index], self.device)


def window_batch(tokens: torch.Tensor, starts: torch.Tensor, T: int, device) -> Dict[str, torch.Tensor]:
    window = tokens[starts + torch.arange(T + 1)]  # [B, T + 1]
    return {"input_ids": window[:, :-1].to(device), "labels": window[:, 1:].to(device)}


def pair_batch(pairs, device) -> Dict[str, torch.Tensor]:
    S = max(len(s) for s, _ in pairs)
    T = max(len(t) for _, t in pairs)
    source = torch.full((len(pairs), S), PAD, dtype=torch.long)
    mask = torch.zeros((len(pairs), S), dtype=torch.long)
    labels = torch.full((len(pairs), T), -100, dtype=torch.long)
    for i, (s, t) in enumerate(pairs):
        source[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
        labels[i, :len(t)] = torch.tensor(t)
    # T5 shifts the labels right behind decoder_start_token_id itself
    return {"input_ids": source.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


def loss_of(model, kind: str, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
    if kind != "t5":
        logits = model(input_ids=batch["input_ids"]).logits  # [B, T, V]
        return F.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten())
    return model(**batch).loss  # mean over the non-pad target tokens


def train(recipe: Recipe, role: str, data, device: torch.device, progress: bool = True):
    from tqdm.auto import tqdm

    s: Schedule = getattr(recipe, f"{role}_train")
    model = make_model(recipe, role, s.seed).to(device).train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=s.lr, betas=(0.9, 0.95))
    batches = Batches(recipe, data, s.seed, device)
    bar = tqdm(range(s.steps), desc=f"{recipe.kind} {role}", disable=not progress)
    for step in bar:
        loss = loss_of(model, recipe.kind, batches.sample(s.batch_size))
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, s)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 10 == 0 or step == s.steps - 1:
            bar.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    return model.eval()


@torch.no_grad()
def heldout_loss(model, recipe: Recipe, data, device) -> float:
    """Mean next-token loss (nats per token) on fixed held-out batches: evenly spread windows (GPT-2) or the
    first pairs in order (T5)."""
    model.eval()
    B = recipe.target_train.batch_size
    losses = []
    for b in range(recipe.eval_batches):
        if recipe.kind != "t5":
            T = recipe.context
            n = recipe.eval_batches * B
            starts = torch.linspace(0, data.numel() - T - 2, n).long()[b * B:(b + 1) * B, None]
            batch = window_batch(data, starts, T, device)
        else:
            batch = pair_batch(data[b * B:(b + 1) * B], device)
        losses.append(loss_of(model, recipe.kind, batch).item())
    return sum(losses) / len(losses)


# ----------------------------------------------------------------------------------------------------------
# the cached pair
# ----------------------------------------------------------------------------------------------------------


def spec_of(recipe: Recipe, corpus_sha: str) -> Dict:
    return {"format": FORMAT, "recipe": dataclasses.asdict(recipe), "corpus_sha256": corpus_sha}


def pair_dir(recipe: Recipe, cache: Optional[os.PathLike] = None) -> Path:
    _, _, sha = load_corpus(recipe)
    key = hashlib.sha256(json.dumps(spec_of(recipe, sha), sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache if cache is not None else cache_root()) / "bench" / f"{recipe.kind}-{key}"


def _write_json(path: Path, value) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=2))
    os.replace(tmp, path)


def build(recipe: Recipe, *, stages: Sequence[str] = ("target", "draft"), device: str = "cpu",
          cache: Optional[os.PathLike] = None, progress: bool = True) -> Path:
    """Trains (or finds) the tokenizer and the requested models of `recipe`, exports them, and returns the
    pair's directory. pair.json is written once both models exist."""
    import transformers

    transformers.utils.logging.disable_progress_bar()  # save / load shard bars; ours is the training bar
    train_texts, val_texts, sha = load_corpus(recipe)
    out = pair_dir(recipe, cache)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(device)
    tok_path = out / "tokenizer.json"
    if not tok_path.exists():
        start = time.perf_counter()
        tokenizer = train_tokenizer(train_texts, recipe.vocab_size)
        tmp = out / f".tokenizer.{os.getpid()}.tmp"
        tokenizer.save(str(tmp))
        os.replace(tmp, tok_path)
        _write_json(out / "tokenizer.meta.json", {"seconds": time.perf_counter() - start,
                                                  "vocab_size": tokenizer.get_vocab_size()})
    tokenizer = load_tokenizer(tok_path)
    if recipe.kind != "t5":
        data, heldout = stream(tokenizer, train_texts), stream(tokenizer, val_texts)
    else:
        data, heldout = (line_pairs(tokenizer, train_texts, recipe.context),
                         line_pairs(tokenizer, val_texts, recipe.context))
    for role in stages:
        info_path = out / f"{role}.json"
        if info_path.exists():
            continue
        start = time.perf_counter()
        model = train(recipe, role, data, dev, progress)
        seconds = time.perf_counter() - start
        loss = heldout_loss(model, recipe, heldout, dev)
        model = model.to("cpu")
        model.save_pretrained(out / role)
        tokenizer.save(str(out / role / "tokenizer.json"))
        meta = speculant.export(out / role, out / f"{role}.pt")
        info = {"params": n_params(model), "heldout_loss": loss, "train_seconds": seconds,
                "steps": getattr(recipe, f"{role}_train").steps, "device": device,
                "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                "config": getattr(recipe, role), "export": meta}
        _write_json(info_path, info)
        print(f"{recipe.kind} {role}: {info['params'] / 1e6:.2f}M parameters, held-out loss {loss:.3f} nats/token, "
              f"trained in {seconds:.0f} s", file=sys.stderr)
    if all((out / f"{r}.json").exists() for r in ("target", "draft")) and not (out / "pair.json").exists():
        units = len(heldout) if recipe.kind == "t5" else int(heldout.numel())
        info = {**spec_of(recipe, sha), "vocab_size": tokenizer.get_vocab_size(),
                "corpus": {"train_modules": len(train_texts), "heldout_modules": len(val_texts),
                           "heldout_" + ("pairs" if recipe.kind == "t5" else "tokens"): units},
                **{r: json.loads((out / f"{r}.json").read_text()) for r in ("target", "draft")}}
        _write_json(out / "pair.json", info)
    return out


# The sibling draft's training (distill, loss="residual"): windows of the training stream, T = 1.
SIBLING = dict(steps=500, window=128, batch_size=8, lr=2e-3, seed=12)


def build_sibling(recipe: Recipe, progress: bool = True) -> Path:
    """A sibling draft beside the pair's draft (the pair must exist): distill's residual loss from a copy of the
    draft, exported as sibling.pt; sibling.json records the sibling's share before and after. Cached."""
    out = pair_dir(recipe)
    if (out / "sibling.json").exists():
        return out
    if not (out / "pair.json").exists():
        raise SystemExit(f"{out}/pair.json: train the pair first (python benchmarks/train_pairs.py --stage gpt2)")
    train_texts, _, _ = load_corpus(recipe)
    corpus = stream(load_tokenizer(out / "tokenizer.json"), train_texts)
    held = [p["prompt_ids"] for p in heldout_prompts(recipe, out, 8)]
    result = speculant.distill(out / "target.pt", out / "draft", loss="residual", beside=out / "draft.pt",
                               data="corpus", corpus=corpus, heldout=held, save=str(out / "sibling"),
                               progress=progress, **SIBLING)
    load_tokenizer(out / "tokenizer.json").save(str(out / "sibling" / "tokenizer.json"))
    meta = speculant.export(out / "sibling", out / "sibling.pt")
    info = {**SIBLING, "share_before": result.alpha_before.mean, "share_before_sem": result.alpha_before.sem,
            "share_after": result.alpha_after.mean, "share_after_sem": result.alpha_after.sem,
            "train_seconds": result.seconds, "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "export": meta}
    _write_json(out / "sibling.json", info)
    print(f"gpt2 sibling: the second child's share {result.alpha_before} -> {result.alpha_after}, trained in "
          f"{result.seconds:.0f} s", file=sys.stderr)
    return out


def heldout_prompts(recipe: Recipe, out: Path, count: int, length: int = 32) -> List[Dict]:
    """A fixed prompt set from held-out modules: for GPT-2, `count` windows of `length` tokens evenly spread
    over the held-out stream (each starting at a line start); for T5, `count` held-out source blocks evenly
    spread over the held-out pairs. Each as {"prompt_ids": ...} or {"encoder_input_ids": ...}."""
    _, val_texts, _ = load_corpus(recipe)
    tokenizer = load_tokenizer(out / "tokenizer.json")
    if recipe.kind == "t5":
        pairs = line_pairs(tokenizer, val_texts, recipe.context)
        picks = torch.linspace(0, len(pairs) - 1, count).long().tolist()
        return [{"encoder_input_ids": pairs[i][0]} for i in picks]
    text = "\n".join(val_texts)
    lines = text.splitlines(keepends=True)
    picks = torch.linspace(0, len(lines) - 200, count).long().tolist()
    prompts = []
    for i in picks:  # from a line start: the first `length` tokens of the next 40 lines
        ids = tokenizer.encode("".join(lines[i:i + 40])).ids
        prompts.append({"prompt_ids": ids[:length]})
    return prompts


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    parser.add_argument("--stage", action="append",
                        choices=["gpt2-target", "gpt2-draft", "t5-target", "t5-draft", "gpt2", "t5", "gpt2-sibling"],
                        help="what to build (repeatable); default: everything")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda"):  # training only: TF32 matmuls (the measurements run in fp32)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    stages = args.stage or ["gpt2", "t5"]
    for kind in ("gpt2", "t5"):
        roles = [r for r in ("target", "draft") if kind in stages or f"{kind}-{r}" in stages]
        if roles:
            out = build(PRESETS[args.preset][kind], stages=roles, device=args.device)
            print(out)
    if "gpt2-sibling" in stages:
        print(build_sibling(PRESETS[args.preset]["gpt2"]))


if __name__ == "__main__":
    main()
