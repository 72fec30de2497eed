"""Distillation: train a draft M_q for α against its target M_p (the paper's §3.6 and conclusion: "standard
distillation with soft targets from M_p, or optimizing M_q for α directly"; DistillSpec, Zhou et al. 2024).

α decides the speedup (Theorem 3.8), and α = 1 - E[D_LK(p, q)] (Corollary 3.6) with D_LK the total variation
distance between the standardized laws (§2.2) at the sampling settings the decoder will use. So the natural loss
is that distance itself, averaged over positions the decoder will meet:

* ``loss="tv"``: D_LK(p, q) = sum_x |p(x) - q(x)| / 2 = 1 - sum_x min(p(x), q(x)), p the target's law as the
  engine standardizes it (temperature, top-k, top-p) and q the draft's softmax at the temperature. Without
  top-k / top-p that is 1 - β exactly, so the mean loss is 1 - α at those positions. With them the engine also
  truncates the draft; the loss leaves that truncation out, because a draft whose kept tokens miss the target's
  would get no gradient at all (its loss flat at 1), and a q that matches p is truncated to p. At temperature 0
  the laws are point masses and α is argmax agreement, which has no gradient: p stays the target's argmax and
  q is the draft at temperature 1, so the loss is 1 - q_1(argmax p).
* ``loss="forward_kl"``: KL(p || q) = sum_x p (log p - log q), standard distillation with soft targets; the
  laws at the temperature only (the truncations of top-k / top-p would make it infinite); at temperature 0
  the cross-entropy to the target's argmax.
* ``loss="reverse_kl"``: KL(q || p), at the temperature only; refused at temperature 0 (p is a point mass).
* ``loss="residual"`` with ``beside=`` a draft model: trains a *sibling draft* (cpp/math/tree.h; SpeculativeDecoder's
  sibling_draft=), whose law s draws a token tree's later children beside the draft's first. When the first child
  (drawn from the draft's q) is rejected, the target's token is drawn from the residual r = norm(max(0, p - q)),
  so the sibling should put its mass there: the loss is the cross-entropy to r weighted by the residual's mass
  1 - β, -sum_x max(0, p(x) - q(x)) log s(x) (p and q standardized as the engine does, s at the temperature),
  zero where q covers p. Its "α" is then the sibling's share: the probability that a node's second child is the
  one accepted under rejection sampling, sum_x min(max(0, p(x) - q(x)), (1 - β) s(x)) (s standardized as the engine
  does), averaged as α is. Refused at temperature 0 (the laws are point masses); decoder-only pairs.

The positions (DistillSpec's data choices): ``data="draft"`` continues the training prompts with the draft's
own samples at the decoding settings, fresh every step (on-policy: where the decoder's drafts go);
``data="target"`` with the target's samples (drawn by speculant's engine, so from the target's law exactly:
the prefixes Corollary 3.6 averages over); ``data="corpus"`` takes windows of the given token corpus as they
are. The loss covers every position after the prompt (the whole window for a corpus).

α is measured before and after on held-out prompts, as Corollary 3.6 defines it: per held-out prompt one
continuation sampled from the target (the same samples before and after, so the two are paired), β = sum_x
min(p, q) at every generated position with both laws standardized by the engine's own function, averaged per
prompt; the result reports the mean over prompts with its spread.

The draft is a transformers model object (trained as a copy: the caller's object is left as it was), a
save_pretrained directory (the result is written to ``save=`` and its path returned), a plain torch module
whose forward(input_ids [B, T]) returns logits [B, T, V] such as ``speculant.tiny_gpt.TinyGPT`` (a trained
copy; with ``save=`` a TinyGPT is also written in the engine's cached TorchScript form), or a feature draft
(EagleDraft, MedusaDraft: a copy of its head is trained on the target it was built on, whose features
teacher-force it; the result is the draft with the trained head, ``save=`` writes the head). A feature draft's
logits are its first draft position's law, so α is that position's; its deeper laws (EAGLE's unrolled depths,
Medusa's later heads) and EAGLE-1/2's feature regression join the loss (``_auxiliary_loss``). The target is anything
``speculant.load`` takes, with the draft's vocabulary.

Encoder-decoders (T5): target and draft both encoder-decoders, the prompts their sources (encoder inputs), each
continued from the target's decoder_start_token_id; the loss and α cover every decoder position after the start.
The target's logits are recomputed per source: its TorchScript export or transformers model (a .pt2 package
would be loaded again for every source, so it is refused by name); data="corpus" is decoder-only.
"""
from __future__ import annotations

import copy
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..decoding import sampling
from ..decoding.decoder import checked_tokenizer, generate, token_ids
from ..models.feature_draft import FeatureDraft
from ..models.live import is_transformers_model, pretrained
from ..models.model import Model, load
from ..models.sequence_logits import sequence_logits
from ..models.tiny_gpt import TinyGPT, script_cached

__all__ = ["AlphaEstimate", "Distillation", "distill", "heldout_alpha", "LOSSES", "DATA"]

LOSSES = ("tv", "forward_kl", "reverse_kl", "residual")
DATA = ("draft", "target", "corpus")
HELDOUT_EVERY = 5  # without heldout=, every 5th prompt is held out for α


@dataclass(frozen=True)
class AlphaEstimate:
    """α over held-out prompts: the mean of the per-prompt means of β, their standard deviation, the per-prompt
    values and the number of positions pooled."""
    mean: float
    std: float
    per_prompt: tuple
    positions: int

    @property
    def sem(self) -> float:
        """The standard error of the mean over prompts."""
        return self.std / math.sqrt(len(self.per_prompt))

    def __str__(self) -> str:
        return f"{self.mean:.3f} ± {self.sem:.3f} (sd {self.std:.3f} over {len(self.per_prompt)} prompts)"


@dataclass
class Distillation:
    """What ``distill`` returns: the trained draft (the kind it was given; a path for a directory), α before
    and after on the held-out prompts (loss="residual": the sibling's share, see the module's docstring), the loss
    of every step, the training seconds, and the files written."""
    draft: Any
    alpha_before: AlphaEstimate
    alpha_after: AlphaEstimate
    losses: List[float]
    seconds: float
    saved: Optional[str] = None
    checkpoints: List[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------------
# The laws and the losses
# ------------------------------------------------------------------------------------------------

def target_law(logits: torch.Tensor, loss: str, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """p [n, V] that `loss` compares the draft with (float32, no gradient): the engine's standardization for
    tv (at temperature 0 the argmax point mass, as for every loss), the temperature alone for the KLs."""
    logits = logits.detach().float()
    if loss == "tv" or temperature == 0.0:
        return sampling.standardize(logits, temperature, top_k, top_p)
    return torch.softmax(logits / temperature, dim=-1)


def draft_log_law(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log q [n, V] with its gradient: the draft's log-softmax at the temperature (at temperature 0, at 1)."""
    return F.log_softmax(logits.float() / (temperature or 1.0), dim=-1)


def position_losses(p: torch.Tensor, log_q: torch.Tensor, loss: str) -> torch.Tensor:
    """The loss at each of n positions [n] (see the module's docstring)."""
    q = log_q.exp()
    if loss == "tv":
        return 0.5 * (p - q).abs().sum(-1)
    if loss == "forward_kl":
        kept = p > 0
        return torch.where(kept, p * (p.clamp_min(1e-30).log() - log_q.masked_fill(~kept, 0.0)), 0.0).sum(-1)
    kept = q > 0  # reverse_kl
    log_p = p.clamp_min(torch.finfo(p.dtype).tiny).log()  # a p that underflowed counts as the smallest float
    return torch.where(kept, q * (log_q.masked_fill(~kept, 0.0) - log_p), 0.0).sum(-1)


def residual_losses(p: torch.Tensor, q: torch.Tensor, log_s: torch.Tensor) -> torch.Tensor:
    """loss="residual" at each of n positions [n]: -sum_x max(0, p(x) - q(x)) log s(x), p and q the target's and the
    draft's standardized laws (no gradient), log_s the sibling's log law with its gradient."""
    residual = (p - q).clamp_min(0.0)
    return -(residual * log_s.masked_fill(residual == 0, 0.0)).sum(-1)


def sibling_share(p_logits: torch.Tensor, q_logits: torch.Tensor, s_logits: torch.Tensor, temperature: float,
                  top_k: int, top_p: float) -> torch.Tensor:
    """[n]: the chance that a node's second child, drawn from the sibling's s, is the one accepted under rejection
    sampling after the first, drawn from q: sum_x min(max(0, p - q), (1 - β) s), all three standardized by the
    engine's function."""
    p, q, s = (sampling.standardize(x.detach().float(), temperature, top_k, top_p)
               for x in (p_logits, q_logits, s_logits))
    return sibling_share_of_laws(p, q, s)


def sibling_share_of_laws(p: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """sibling_share from the standardized laws themselves [..., V] (any float dtype): sum_x min(max(0, p - q),
    (1 - β) s), the mass 1 - β being the residual's own."""
    residual = (p - q).clamp_min(0.0)
    return torch.minimum(residual, residual.sum(-1, keepdim=True) * s).sum(-1)


def beta(p_logits: torch.Tensor, q_logits: torch.Tensor, temperature: float, top_k: int,
         top_p: float) -> torch.Tensor:
    """β [n] = sum_x min(p, q) (sampling.beta) with both laws standardized as the engine does (Corollary 3.6)."""
    p = sampling.standardize(p_logits.detach().float(), temperature, top_k, top_p)
    q = sampling.standardize(q_logits.detach().float(), temperature, top_k, top_p)
    return sampling.beta(p, q)


# ------------------------------------------------------------------------------------------------
# The draft being trained
# ------------------------------------------------------------------------------------------------

class _Draft:
    """The trainable draft: its module, how to get logits [B, T, V] from it, and how to give it back."""

    def __init__(self, draft, save: Optional[str]):
        self.directory = None
        self.feature = draft if isinstance(draft, FeatureDraft) else None  # EagleDraft, MedusaDraft: its head
        self.auxiliary: tuple = ([], None)  # a feature draft's deeper laws and regression from the last logits()
        self.teacher_logits: Optional[torch.Tensor] = None  # and the target's logits from the same forward
        if self.feature is not None:
            if draft.target.module is None:
                raise ValueError(f"draft: {type(draft).__name__} reads {draft.target.source}, an exported file; "
                                 "distill trains a head on the live transformers model: train it there, save it, "
                                 f"then load it onto the export ({type(draft).__name__}.load(directory, exported))")
            self.module = copy.deepcopy(draft.head)
        elif isinstance(draft, (str, os.PathLike)):
            if not os.path.isdir(draft):
                raise ValueError(f"draft: {os.fspath(draft)!r} is not a save_pretrained directory; distill trains "
                                 "a transformers model object or directory, or a torch module returning logits "
                                 "(exported TorchScript / .pt2 files cannot be trained)")
            self.directory = os.fspath(draft)
            self.module = pretrained(self.directory, None)
        elif isinstance(draft, torch.jit.ScriptModule):
            raise ValueError("draft: a TorchScript module cannot be trained here; pass the module it was made from "
                             "(a TinyGPT: speculant.tiny_gpt.unscript gives it back) or a transformers model")
        elif isinstance(draft, torch.nn.Module):
            self.module = copy.deepcopy(draft)
        else:
            raise ValueError(f"draft must be a transformers model, a save_pretrained directory, a torch module or a "
                             f"feature draft (EagleDraft, MedusaDraft), "
                             f"got {type(draft).__name__}")
        self.transformers = is_transformers_model(self.module)
        self.encoder_decoder = self.transformers and bool(getattr(self.module.config, "is_encoder_decoder", False))
        if save is not None and not (self.transformers or self.feature or isinstance(self.module, TinyGPT)):
            raise ValueError("save: only transformers models and TinyGPT modules can be written in a form "
                             "speculant.load takes; leave save out and export the returned module")
        self.module.requires_grad_(True)
        parameter = next(self.module.parameters(), None)
        if parameter is None:
            raise ValueError("draft has no parameters to train")
        self.device = parameter.device

    def logits(self, ids: torch.Tensor, sources: Optional[torch.Tensor] = None,
               all_depths: bool = False) -> torch.Tensor:
        """[B, T, V] float logits for ids [B, T] (with the gradient when enabled); an encoder-decoder's decoder
        ids after its sources [B, S]. A feature draft's are its first draft position's law, teacher-forced by the
        target's features; with `all_depths` its deeper laws and regression are kept in `auxiliary`."""
        if self.feature is not None:
            laws, regression, self.teacher_logits = self.feature.training_laws(self.module, ids, all_depths)
            self.auxiliary = (laws[1:], regression)
            return laws[0][0].float()
        if self.encoder_decoder:
            out = self.module(input_ids=sources, attention_mask=torch.ones_like(sources), decoder_input_ids=ids,
                              use_cache=False).logits
        elif self.transformers:
            out = self.module(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
        else:
            out = self.module(ids)
            out = getattr(out, "logits", out)
        if not isinstance(out, torch.Tensor) or out.dim() != 3 or out.shape[:2] != ids.shape:
            raise ValueError(f"draft: forward(input_ids {list(ids.shape)}) must return logits [B, T, V], got "
                             f"{getattr(out, 'shape', type(out).__name__)}")
        return out.float()

    def result(self, save: Optional[str]):
        """The trained draft in the kind it came, written to `save` when given; returns (draft, saved path)."""
        self.module.eval().requires_grad_(False)
        if self.feature is not None:
            trained = self.feature.with_head(self.module)
            return trained, (None if save is None else trained.save(save))
        if save is None:
            return self.module, None
        save = os.fspath(save)
        if self.transformers:
            self.module.save_pretrained(save)
        else:
            Path(save).parent.mkdir(parents=True, exist_ok=True)
            torch.jit.save(script_cached(self.module), save)
        return (save if self.directory is not None else self.module), save


class _Target:
    """The target: its handle for sampling (the engine), its logits [T, V] over a whole sequence (row i: the law
    of token i + 1; an encoder-decoder's after a source, recomputed per source), and where a decoder starts."""

    def __init__(self, target, name: str = "target"):
        self.handle = target if isinstance(target, Model) else load(target)
        self.encoder_decoder = self.handle.encoder_decoder
        if not self.encoder_decoder:
            bound = sequence_logits(target if isinstance(target, torch.jit.ScriptModule) else self.handle, name)
            self._logits = lambda sequence, source: bound(sequence)
            return
        self.start = self.handle.decoder_start_token_id
        if self.start is None:
            raise ValueError(f"{name}: an encoder-decoder needs a decoder_start_token_id (in its config or export "
                             "metadata) to start each source's continuation from")
        if self.handle.form == "pt2":
            raise ValueError(f"{name}: an encoder-decoder .pt2 package would be loaded again for every source; "
                             "distill it with the TorchScript export or the transformers model")
        model = target if isinstance(target, torch.jit.ScriptModule) else self.handle
        if self.handle.module is None and not isinstance(target, torch.jit.ScriptModule):
            with warnings.catch_warnings():  # TorchScript's deprecation notice (torch >= 2.11), nothing else
                warnings.filterwarnings("ignore", message=r"`torch\.jit\.\w+` is deprecated")
                model = torch.jit.load(self.handle.source, map_location=self.handle.device)  # encoded per source
        self._logits = lambda sequence, source: sequence_logits(model, name, source)(sequence)

    def logits(self, sequence: List[int], source: Optional[List[int]] = None) -> torch.Tensor:
        return self._logits(sequence, source)

    def sample(self, prompt: List[int], new_tokens: int, settings, seed: int) -> tuple:
        """(sequence, first loss position): the prompt continued by the target (the engine) with this seed; an
        encoder-decoder's prompt is its source, continued from the decoder start."""
        options = dict(max_new_tokens=new_tokens, temperature=settings[0], top_k=settings[1], top_p=settings[2],
                       seed=seed)
        if self.encoder_decoder:
            return [self.start] + list(generate(self.handle, [self.start], encoder_input_ids=prompt,
                                                **options).tokens), 0
        return prompt + list(generate(self.handle, prompt, **options).tokens), len(prompt) - 1


# ------------------------------------------------------------------------------------------------
# Arguments
# ------------------------------------------------------------------------------------------------

def _choice(value, name: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


def _count(value, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _positive(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def _sequences(values, name: str, tokenizer, vocab: int) -> List[List[int]]:
    if values is None or isinstance(values, (str, bytes)) or len(values) == 0:
        raise ValueError(f"{name} must be a non-empty list of prompts (token ids, or strings with tokenizer=)")
    out = []
    for i, value in enumerate(values):
        ids = token_ids(value, f"{name}[{i}]", tokenizer)
        if not ids:
            raise ValueError(f"{name}[{i}] is empty: a prompt needs at least one token")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"{name}[{i}] has token {bad[0]} outside the vocabulary [0, {vocab})")
        out.append(ids)
    return out


# ------------------------------------------------------------------------------------------------
# distill
# ------------------------------------------------------------------------------------------------

def distill(target, draft, prompts=None, *, steps: int = 200, temperature: float = 1.0, top_k: int = 0,
            top_p: float = 1.0, loss: str = "tv", data: str = "draft", corpus=None, window: int = 64,
            heldout=None, new_tokens: int = 32, batch_size: int = 8, lr: float = 3e-4, weight_decay: float = 0.0,
            tokenizer=None, seed: int = 0, save: Optional[str] = None, checkpoint_dir: Optional[str] = None,
            checkpoint_every: int = 0, resume: Optional[str] = None, progress: bool = True,
            beside=None) -> Distillation:
    """Trains ``draft`` for α against ``target`` at the sampling settings ``temperature``, ``top_k``, ``top_p``
    the decoder will use (see the module's docstring for the losses, the data and α). Returns a Distillation.

    prompts: training prompts (token ids, or strings with ``tokenizer=``), continued by ``new_tokens`` sampled
    tokens (``data="draft"`` or ``"target"``); without ``heldout=`` every 5th is held out for α instead.
    corpus: with ``data="corpus"``, token ids (one sequence or several) cut into random windows of ``window``
    tokens; ``heldout=`` is then required. Each step: ``batch_size`` sequences, AdamW (``lr``,
    ``weight_decay``), gradients clipped to norm 1. ``seed`` fixes the batches, the samples, dropout and the
    held-out continuations. ``checkpoint_dir`` with ``checkpoint_every=n`` writes step-<n>.pt every n steps (weights,
    optimizer, random state, losses); ``resume=`` one of them continues that run to ``steps`` as if it had not
    stopped. ``save=``: where to write the trained draft in a form ``speculant.load`` takes (a directory for a
    transformers model, a TorchScript file for a TinyGPT); required for a draft given as a directory.
    ``beside=``: with loss="residual" only, the draft model (anything ``speculant.load`` takes) that ``draft`` will
    draw siblings beside; ``draft`` is then usually a copy of it to start from.
    """
    loss = _choice(loss, "loss", LOSSES)
    data = _choice(data, "data", DATA)
    steps = _count(steps, "steps", 1)
    settings = sampling.SamplingSettings(temperature, top_k, top_p).standardization()
    _check_loss(loss, settings[0], beside)
    new_tokens, batch_size = _count(new_tokens, "new_tokens", 1), _count(batch_size, "batch_size", 1)
    lr = _positive(lr, "lr")
    if isinstance(weight_decay, bool) or not isinstance(weight_decay, (int, float)) or not 0 <= weight_decay < 1:
        raise ValueError(f"weight_decay must be in [0, 1), got {weight_decay!r}")
    checkpoint_every = _count(checkpoint_every, "checkpoint_every", 0)
    if checkpoint_every and checkpoint_dir is None:
        raise ValueError("checkpoint_every needs checkpoint_dir=, the directory to write the checkpoints to")
    tokenizer = checked_tokenizer(tokenizer)

    teacher, trainee, first = _models(target, draft, beside, save)
    vocab = teacher.handle.vocab_size
    examples = _examples(data, prompts, corpus, heldout, window, tokenizer, teacher, vocab)
    references = _references(teacher, examples.held, new_tokens, settings, seed, first)  # kept for α after
    alpha_before = _alpha(trainee, references, settings, vocab)
    losses, checkpoints, seconds = _train(
        trainee, teacher, first, examples, loss, settings, vocab, steps=steps, batch_size=batch_size,
        new_tokens=new_tokens, lr=lr, weight_decay=weight_decay, seed=seed, resume=resume,
        checkpoint_every=checkpoint_every, checkpoint_dir=checkpoint_dir, progress=progress)
    alpha_after = _alpha(trainee, references, settings, vocab)
    result, saved = trainee.result(save)
    return Distillation(result, alpha_before, alpha_after, losses, seconds, saved, checkpoints)


def _check_loss(loss: str, temperature: float, beside) -> None:
    """ValueError where the loss is undefined at the temperature, or beside= and loss="residual" come apart."""
    if loss == "reverse_kl" and temperature == 0.0:
        raise ValueError("loss='reverse_kl' is undefined at temperature 0 (the target's law is a point mass); use "
                         "'tv' or 'forward_kl'")
    if (loss == "residual") != (beside is not None):
        given = "given" if beside is not None else None
        raise ValueError("beside= goes with loss='residual' (the draft a sibling draft is trained beside), and "
                         f"loss='residual' needs it; got loss={loss!r} and beside={given}")
    if loss == "residual" and temperature == 0.0:
        raise ValueError("loss='residual' is undefined at temperature 0 (the laws are point masses, a sibling draft "
                         "draws sampled children)")


def _models(target, draft, beside, save: Optional[str]) -> tuple:
    """(teacher, trainee, first): the target, the draft to train and, for loss="residual", the draft beside it
    (else None). ValueError where they do not fit together."""
    teacher = _Target(target)
    vocab = teacher.handle.vocab_size
    if isinstance(draft, (str, os.PathLike)) and os.path.isdir(draft) and save is None:
        raise ValueError("save: a draft given as a directory needs save=, the directory to write the distilled "
                         "draft to")
    trainee = _Draft(draft, save)
    if trainee.feature is not None and target is not draft.target and target is not draft.target.module:
        raise ValueError(f"target: {type(draft).__name__} learns from the target it was built on "
                         f"({draft.target.source}); pass that one")
    _same_kind(teacher, trainee)
    _same_vocabulary(teacher, trainee, vocab)
    first = None
    if beside is not None:
        first = _Target(beside, "beside")
        if teacher.encoder_decoder or first.encoder_decoder:
            raise ValueError("loss='residual': sibling drafts are decoder-only (token trees of encoder-decoders draft "
                             "with one model)")
        if first.handle.vocab_size != vocab:
            raise ValueError(f"beside: its vocabulary ({first.handle.vocab_size}) must be the target's ({vocab})")
    return teacher, trainee, first


class _Examples(NamedTuple):
    """What distill learns from and measures α on."""
    data: str  # "draft", "target" or "corpus"
    prompts: List[List[int]]  # training prompts (none for a corpus)
    pieces: List[List[int]]  # corpus sequences at least a window long (none for prompts)
    window: int
    held: List[List[int]]  # held-out prompts for α


def _examples(data: str, prompts, corpus, heldout, window, tokenizer, teacher: _Target, vocab: int) -> _Examples:
    """The training data and the held-out prompts, checked. Without heldout=, every 5th prompt is held out."""
    if data == "corpus":
        if teacher.encoder_decoder:
            raise ValueError("data='corpus' takes decoder-only pairs; an encoder-decoder pair learns from its "
                             "sources: pass them as prompts= with data='target' or 'draft'")
        if corpus is None or heldout is None:
            raise ValueError("data='corpus' needs corpus= (token ids) and heldout= (prompts to measure α on)")
        window = _count(window, "window", 2)
        pieces = [token_ids(c, "corpus", tokenizer) for c in (corpus if _nested(corpus) else [corpus])]
        pieces = [c for c in pieces if len(c) >= window]
        if not pieces:
            raise ValueError(f"corpus: no sequence has window={window} tokens")
        return _Examples(data, [], pieces, window, _sequences(heldout, "heldout", tokenizer, vocab))
    if corpus is not None:
        raise ValueError(f"corpus= is used with data='corpus' only, got data={data!r}")
    everything = _sequences(prompts, "prompts", tokenizer, vocab)
    if heldout is not None:
        return _Examples(data, everything, [], window, _sequences(heldout, "heldout", tokenizer, vocab))
    if len(everything) < 2:
        raise ValueError("prompts: give at least 2 (every 5th is held out for α) or pass heldout=")
    train_prompts = [p for i, p in enumerate(everything) if i % HELDOUT_EVERY]
    return _Examples(data, train_prompts, [], window, everything[::HELDOUT_EVERY])


# ------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------

def _train(trainee: _Draft, teacher: _Target, first: Optional[_Target], examples: _Examples, loss: str, settings,
           vocab: int, *, steps: int, batch_size: int, new_tokens: int, lr: float, weight_decay: float, seed: int,
           resume: Optional[str], checkpoint_every: int, checkpoint_dir: Optional[str], progress: bool) -> tuple:
    """The training loop, from step 0 or from the checkpoint `resume`. Returns (losses, checkpoint paths,
    seconds)."""
    from tqdm.auto import tqdm

    generator = torch.Generator().manual_seed(seed)  # batches and samples
    optimizer = torch.optim.AdamW(trainee.module.parameters(), lr=lr, weight_decay=weight_decay)
    losses: List[float] = []
    checkpoints: List[str] = []
    start = 0
    cuda = [trainee.device.index or 0] if trainee.device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):  # dropout draws from the global generators: seeded, restored after
        torch.manual_seed(seed)
        if resume is not None:
            losses, start = _resumed(resume, trainee, optimizer, generator, cuda, steps)
        began = time.perf_counter()
        bar = tqdm(total=steps, initial=start, desc="speculant distill", disable=not progress)
        try:
            for step in range(start, steps):
                trainee.module.eval()  # sampling without dropout
                batch = _batch(examples, batch_size, trainee, teacher, settings, new_tokens, generator, vocab)
                losses.append(_step(trainee, optimizer, batch, teacher, loss, settings, vocab, step, first))
                bar.update()
                bar.set_postfix(loss=f"{losses[-1]:.4f}")
                if checkpoint_every and (step + 1) % checkpoint_every == 0:
                    checkpoints.append(_checkpoint(checkpoint_dir, step + 1, trainee, optimizer, generator, cuda,
                                                   losses))
        finally:
            bar.close()
    return losses, checkpoints, time.perf_counter() - began


def _resumed(path: str, trainee: _Draft, optimizer, generator: torch.Generator, cuda: List[int],
             steps: int) -> tuple:
    """Restores a checkpoint's weights, optimizer and random state. Returns (its losses, its step)."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    trainee.module.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    generator.set_state(state["generator"])
    torch.set_rng_state(state["global"])
    if cuda:
        torch.cuda.set_rng_state(state["global_cuda"], trainee.device)
    losses, start = list(state["losses"]), int(state["step"])
    if start > steps:
        raise ValueError(f"resume: the checkpoint is at step {start}, past steps={steps}")
    return losses, start


def _checkpoint(directory: str, step: int, trainee: _Draft, optimizer, generator: torch.Generator,
                cuda: List[int], losses: List[float]) -> str:
    """Writes step-<step>.pt in `directory` (weights, optimizer, random state, losses). Returns its path."""
    path = Path(directory) / f"step-{step:06d}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": trainee.module.state_dict(), "optimizer": optimizer.state_dict(),
                "generator": generator.get_state(), "global": torch.get_rng_state(),
                **({"global_cuda": torch.cuda.get_rng_state(trainee.device)} if cuda else {}),
                "losses": losses, "step": step}, path)
    return str(path)


def _batch(examples: _Examples, size: int, trainee: _Draft, teacher: _Target, settings, new_tokens: int,
           generator: torch.Generator, vocab: int) -> list:
    """One step's batch: random windows of the corpus, or random prompts continued by the draft or the target."""
    if examples.data == "corpus":
        return [_window(examples.pieces, examples.window, generator) for _ in range(size)]
    chosen = torch.randint(len(examples.prompts), (size,), generator=generator).tolist()
    return _continue([examples.prompts[i] for i in chosen], examples.data, trainee, teacher, settings, new_tokens,
                     generator, vocab)


def _step(trainee: _Draft, optimizer, batch, teacher: _Target, loss: str, settings, vocab: int, step: int,
          first: Optional[_Target] = None) -> float:
    """One optimizer step on `batch` [(sequence, first loss position, source or None)], the draft called once
    per sequence (and source) length; returns the batch's loss (the mean over sequences of each one's mean over
    positions). `first`: loss="residual"'s draft beside the trainee."""
    trainee.module.train()
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for group in _by_length([(sequence, source) for sequence, _, source in batch]):
        ids, sources = _tensors([batch[i] for i in group], trainee.device)
        q_all = _padded(trainee.logits(ids, sources, all_depths=True), vocab)  # [g, T, V]
        value = 0.0
        for row, i in enumerate(group):
            sequence, begin, source = batch[i]
            if trainee.teacher_logits is not None:  # a feature draft's forward of the target made them
                p_logits = _padded(trainee.teacher_logits[row, begin:], vocab)
            else:
                p_logits = teacher.logits(sequence, source)[begin:].to(trainee.device)  # [n, V]
            log_q = draft_log_law(q_all[row, begin:], settings[0])
            if first is not None:
                beside = first.logits(sequence, source)[begin:].to(trainee.device)
                p, q = (sampling.standardize(x.detach().float(), *settings) for x in (p_logits, beside))
                value = value + residual_losses(p, q, log_q).mean()
            else:
                value = value + position_losses(target_law(p_logits, loss, *settings), log_q, loss).mean()
                value = value + _auxiliary_loss(trainee.auxiliary, row, begin, p_logits, loss, settings, vocab)
        value = value / len(batch)
        if not torch.isfinite(value):
            raise FloatingPointError(f"distill: the {loss} loss became {value.item()} at step {step + 1} (lower lr=)")
        value.backward()
        total += value.item()
    torch.nn.utils.clip_grad_norm_(trainee.module.parameters(), 1.0)
    optimizer.step()
    return total


def _auxiliary_loss(auxiliary: tuple, row: int, begin: int, p_logits: torch.Tensor, loss: str, settings,
                    vocab: int):
    """A feature draft's losses beyond its first draft position, for one sequence whose target logits from `begin`
    on are p_logits: each deeper law (EAGLE's unrolled depths, Medusa's later heads) against the target's law of
    the token it predicts, and EAGLE-1/2's smooth L1 regression of the predicted features on the target's."""
    laws, regression = auxiliary
    value = 0.0
    for logits, offset, first in laws:
        start = max(begin, first)
        count = p_logits.size(0) - (start - begin) - offset
        if count <= 0:
            continue
        log_q = draft_log_law(_padded(logits[row, start:start + count], vocab), settings[0])
        p = target_law(p_logits[start - begin + offset:start - begin + offset + count], loss, *settings)
        value = value + position_losses(p, log_q, loss).mean()
    if regression is not None:
        predicted, target = regression
        value = value + F.smooth_l1_loss(predicted[row, begin:].float(), target[row, begin:].float())
    return value


def _by_length(items) -> List[List[int]]:
    """The indices of `items` (sequences, or (sequence, source or None) pairs) grouped by their lengths, in order
    of first appearance."""
    groups: Dict[Any, List[int]] = {}
    for i, item in enumerate(items):
        key = (len(item[0]), -1 if item[1] is None else len(item[1])) if isinstance(item, tuple) else len(item)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _tensors(examples, device) -> tuple:
    """(ids [g, T], sources [g, S] or None) of examples [(sequence, begin, source or None)] of equal lengths."""
    ids = torch.tensor([sequence for sequence, _, _ in examples], dtype=torch.long, device=device)
    if examples[0][2] is None:
        return ids, None
    return ids, torch.tensor([source for _, _, source in examples], dtype=torch.long, device=device)


def _same_kind(teacher: _Target, trainee: _Draft) -> None:
    if teacher.encoder_decoder != trainee.encoder_decoder:
        kinds = {True: "an encoder-decoder", False: "decoder-only"}
        raise ValueError(f"target and draft must both be encoder-decoders or both decoder-only: the target is "
                         f"{kinds[teacher.encoder_decoder]}, the draft {kinds[trainee.encoder_decoder]}")


def _same_vocabulary(teacher: _Target, trainee: _Draft, vocab: int) -> None:
    """ValueError unless the draft's logits index the target's vocabulary, checked with one token before any
    training step (the target's token ids would otherwise overrun the draft's embedding). A smaller draft passes
    only when the target's ids beyond it are padding of probability 0 (-inf logits, as load(vocab_size=) makes)."""
    probe = torch.zeros(1, 1, dtype=torch.long, device=trainee.device)
    with torch.no_grad():
        own = trainee.logits(probe, probe if trainee.encoder_decoder else None).size(-1)
    if own < vocab:
        first = [teacher.start] if teacher.encoder_decoder else [0]
        row = teacher.logits(first, [0] if teacher.encoder_decoder else None)[-1]  # [V]
        if torch.isneginf(row[own:]).all():
            return
    if own != vocab:
        raise ValueError(
            f"draft: its vocabulary has {own} tokens and the target's {vocab}: distill trains the draft on the "
            "target's token ids, so both must index one vocabulary. Use a draft built with the target's tokenizer "
            f"and vocab_size={vocab} (a transformers draft: draft.resize_token_embeddings({vocab})); a draft with "
            "another tokenizer drafts through text (SpeculativeDecoder(..., draft_tokenizer=, target_tokenizer=)) "
            "and is not distilled")


def _nested(corpus) -> bool:
    return isinstance(corpus, (list, tuple)) and len(corpus) > 0 and not isinstance(corpus[0], (int, np.integer))


def _padded(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """The draft's logits [n, V_own] on the target's vocabulary (extra rows masked, as load(vocab_size=) does)."""
    return F.pad(logits, (0, vocab - logits.size(-1)), value=float("-inf"))


def _window(pieces: List[List[int]], window: int, generator: torch.Generator):
    piece = pieces[torch.randint(len(pieces), (1,), generator=generator).item()]
    start = torch.randint(len(piece) - window + 1, (1,), generator=generator).item()
    return piece[start:start + window], 0, None


def _continue(prompts: List[List[int]], data: str, trainee: _Draft, teacher: _Target, settings, new_tokens: int,
              generator: torch.Generator, vocab: int) -> List[tuple]:
    """[(sequence, first loss position, source or None)]: each prompt (an encoder-decoder's source, its sequence
    starting at the decoder start) and new_tokens sampled from the target (the engine) or the draft (one call
    per token for all prompts of a length)."""
    seeds = torch.randint(1 << 62, (len(prompts),), generator=generator).tolist()
    source = (lambda prompt: prompt) if teacher.encoder_decoder else (lambda prompt: None)
    if data == "target":
        return [(*teacher.sample(prompt, new_tokens, settings, seed), source(prompt))
                for prompt, seed in zip(prompts, seeds)]
    starts = [[teacher.start] if teacher.encoder_decoder else prompt for prompt in prompts]
    out: List[Optional[tuple]] = [None] * len(prompts)
    with torch.no_grad():
        for group in _by_length([(starts[i], source(prompts[i])) for i in range(len(prompts))]):
            draws = torch.Generator().manual_seed(seeds[group[0]])
            ids, sources = _tensors([(starts[i], 0, source(prompts[i])) for i in group], trainee.device)
            for _ in range(new_tokens):
                law = sampling.standardize(_padded(trainee.logits(ids, sources)[:, -1], vocab).cpu(), *settings)
                drawn = torch.multinomial(law.double(), 1, generator=draws)  # [g, 1]
                ids = torch.cat([ids, drawn.to(ids.device)], dim=1)
            for row, i in enumerate(group):
                out[i] = (ids[row].tolist(), len(starts[i]) - 1, source(prompts[i]))
    return out


def heldout_alpha(target, draft, prompts, *, new_tokens: int = 32, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0, seed: int = 0, tokenizer=None) -> AlphaEstimate:
    """α of ``draft`` (a kind ``distill`` takes) for ``target`` measured as ``distill`` reports it before and
    after: on the target's continuations of ``prompts`` (prompt i drawn with seed + i), so two drafts measured
    with the same arguments are compared on the same positions."""
    teacher = _Target(target)
    settings = sampling.SamplingSettings(temperature, top_k, top_p).standardization()
    held = _sequences(prompts, "prompts", checked_tokenizer(tokenizer), teacher.handle.vocab_size)
    trainee = _Draft(draft, None)
    _same_kind(teacher, trainee)
    references = _references(teacher, held, _count(new_tokens, "new_tokens", 1), settings, seed)
    return _alpha(trainee, references, settings, teacher.handle.vocab_size)


def _references(teacher: _Target, held: List[List[int]], new_tokens: int, settings, seed: int,
                first: Optional[_Target] = None):
    """[(sequence, first continuation position, source or None, the target's logits at the continuation's
    positions [new_tokens, V], loss="residual"'s draft's there or None)]: each held-out prompt (source) continued
    by the target itself (the engine, prompt i with seed + i)."""
    out = []
    for i, prompt in enumerate(held):
        sequence, begin = teacher.sample(prompt, new_tokens, settings, seed + i)
        source = prompt if teacher.encoder_decoder else None
        beside = first.logits(sequence, source)[begin:len(sequence) - 1] if first is not None else None
        out.append((sequence, begin, source, teacher.logits(sequence, source)[begin:len(sequence) - 1], beside))
    return out


def _alpha(trainee: _Draft, references, settings, vocab: int) -> AlphaEstimate:
    trainee.module.eval()
    per_prompt, positions = [], 0
    with torch.no_grad():
        for sequence, begin, source, p_logits, beside in references:
            ids, sources = _tensors([(sequence, begin, source)], trainee.device)
            q_logits = _padded(trainee.logits(ids, sources)[0, begin:len(sequence) - 1], vocab)
            if beside is not None:  # loss="residual": the trainee's share as a second child beside that draft
                values = sibling_share(p_logits.to(q_logits.device), beside.to(q_logits.device), q_logits, *settings)
            else:
                values = beta(p_logits.to(q_logits.device), q_logits, *settings)
            per_prompt.append(values.mean().item())
            positions += values.numel()
    mean = float(np.mean(per_prompt))
    std = float(np.std(per_prompt, ddof=1)) if len(per_prompt) > 1 else 0.0
    return AlphaEstimate(mean, std, tuple(per_prompt), positions)
