"""The public decoding API: speculative decoding (Algorithm 1 in a loop) and plain decoding, both run by the
C++ engine with the GIL released."""

from __future__ import annotations

import numbers
import os
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .. import _core
from . import beams, graphs
from ..arguments import INT64_MAX, flag, integer, real
from .cross_tokenizer import CrossTokenizer
from .drafters import Drafter
from ..models.early_exit import EarlyExitDraft
from ..models.feature_draft import FeatureDraft
from ..models.model import Model, as_model, second_load
from .sampling import SamplingSettings, overridden
from .trace import Trace
from .trees import TreeChoice, TreeSpeedup, tree_depth, tree_parents

PromptIds = Union[Sequence[int], torch.Tensor, np.ndarray, Mapping, str]
DEFAULT_GAMMA = 4  # draft tokens per iteration: Theorem 3.8's optimum (§3.5) at alpha = 0.7, c = 0.1


@dataclass(frozen=True)
class Result:
    """What a generation returns.

    tokens: the new token ids (an EOS that stopped the run is included).
    stats: counts, acceptance, alpha (Corollary 3.6) and the time split (speculant.Stats).
    trace: the per-iteration record, the paper's Figure 1 (speculant.Trace).
    """

    tokens: List[int]
    stats: _core.Stats
    trace: Trace
    text: Optional[str] = None  # the tokens decoded, when generate was given a tokenizer
    # A hierarchical draft's levels below the top (levels[0]: the draft decoder's own statistics, its target
    # being the top's draft model; then the next level's); empty otherwise.
    levels: Tuple[_core.Stats, ...] = ()


SIBLINGS = ("without_replacement", "with_replacement", "top", "coupled")
VERIFICATIONS = ("token", "block")  # how a chain is verified (SpeculativeDecoder: verification)


def _siblings(value) -> str:
    if not isinstance(value, str) or value not in SIBLINGS:
        raise ValueError(f"siblings must be one of {SIBLINGS}, got {value!r}")
    return value


def _verification(value, tree, settings: SamplingSettings, siblings: str = "with_replacement") -> str:
    if not isinstance(value, str) or value not in VERIFICATIONS:
        raise ValueError(f"verification must be one of {VERIFICATIONS}, got {value!r}")
    if value == "block" and isinstance(tree, DynamicTree):
        raise ValueError("verification='block' takes a chain or a tree of fixed shape: on a grown tree (budget=) the "
                         "shapes of sibling subtrees depend on each other's draws, which traversal verification's "
                         "proof (cpp/math/tree.h) does not cover; a grown tree takes verification='token'")
    if value == "block" and tree and siblings == "coupled":
        raise ValueError("verification='block' on a tree is traversal verification (cpp/math/tree.h), proven for "
                         "siblings 'with_replacement', 'without_replacement' and 'top'; siblings='coupled' (the "
                         "default) takes verification='token'")
    if value == "block" and settings.lenience != 1.0:
        raise ValueError(f"lenience must be 1 with verification='block' (A.5's bound is proven for the token rule), "
                         f"got {settings.lenience!r}")
    return value


def checked_tokenizer(value):
    """None, or an object with encode and decode (a transformers tokenizer, a tokenizers.Tokenizer)."""
    if value is not None and not all(callable(getattr(value, m, None)) for m in ("encode", "decode")):
        raise ValueError("tokenizer must be a transformers tokenizer or a tokenizers.Tokenizer (an object with "
                         f"encode and decode), got {type(value).__name__}")
    return value


def token_ids(value: PromptIds, name: str, tokenizer=None) -> List[int]:
    """Token ids from a sequence, a 1-D or [1, T] tensor or numpy array, a tokenizer's output (a mapping with
    input_ids, such as a BatchEncoding), or a string encoded by `tokenizer`."""
    if isinstance(value, str):
        if tokenizer is None:
            raise ValueError(f"{name} is a string: pass tokenizer= (a transformers tokenizer or a "
                             "tokenizers.Tokenizer) to encode it, or pass token ids")
        encoded = tokenizer.encode(value)
        value = encoded.ids if hasattr(encoded, "ids") else encoded
    if isinstance(value, Mapping):
        if "input_ids" not in value:
            raise ValueError(f"{name} is a mapping without 'input_ids' (keys: {sorted(value)})")
        mask = value.get("attention_mask")
        if mask is not None and not bool(np.all(np.asarray(mask) == 1)):
            raise ValueError(f"{name}: the attention_mask has padding; a row given as its own mapping must be "
                             "unpadded (pass a padded batch as one 2-D input_ids with its attention_mask)")
        value = value["input_ids"]
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], (list, tuple)):
        value = value[0]  # a batch of one, as tokenizers return it
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if isinstance(value, torch.Tensor):
        if value.dim() == 2 and value.size(0) == 1:
            value = value[0]
        if value.dim() != 1 or value.dtype.is_floating_point or value.dtype == torch.bool:
            raise ValueError(f"{name} must be a sequence of token ids, a 1-D or [1, T] integer tensor; got "
                             f"a {value.dtype} tensor of shape {list(value.shape)}")
        return value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ValueError(f"{name} must be a sequence of token ids, got {type(value).__name__}")
    ids = list(value)
    for i, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, numbers.Integral) or not -INT64_MAX <= token <= INT64_MAX:
            raise ValueError(f"{name}[{i}] must be an integer token id, got {token!r}")
    return [int(t) for t in ids]


def _draft(value, device=None, dtype=None) -> Union[Model, Drafter, "SpeculativeDecoder"]:
    """A drafter, a SpeculativeDecoder (a hierarchical draft), or a speculant.Model from anything
    speculant.load takes."""
    if isinstance(value, (Drafter, Model, SpeculativeDecoder)):
        return value
    if isinstance(value, (str, os.PathLike, torch.nn.Module)):
        return as_model(value, "draft", device, dtype)
    raise ValueError("draft must be a model (a speculant.Model, a transformers model, a model path), a drafter "
                     "from speculant.drafters or a SpeculativeDecoder (a hierarchical draft), got "
                     f"{type(value).__name__}")


def _cross_tokenizer(draft: Union[Model, Drafter], draft_tokenizer, target_tokenizer, target: Model) -> Drafter:
    """The draft model behind a CrossTokenizer drafter (cross_tokenizer.py) for SpeculativeDecoder's tokenizers."""
    if draft_tokenizer is None or target_tokenizer is None:
        raise ValueError("draft_tokenizer and target_tokenizer go together: a draft with another tokenizer needs "
                         "both (the target's to decode the sequence, the draft's to encode it)")
    if not isinstance(draft, Model):
        raise ValueError("draft_tokenizer: the draft must be a model (a drafter or a SpeculativeDecoder already "
                         f"proposes the target's tokens), got {type(draft).__name__}")
    return CrossTokenizer(draft, draft_tokenizer, target_tokenizer, target.vocab_size, device=target.device)


def _drafter(value: Union[Model, Drafter, "SpeculativeDecoder"], sibling: Optional[Model] = None,
             confidence: float = 0.0) -> _core.Drafter:
    if isinstance(value, SpeculativeDecoder):
        return value._core.as_draft(**value._schedule)
    if isinstance(value, Drafter):
        return value.engine
    return _core.model_drafter(value.engine, sibling.engine if sibling is not None else None, confidence)


def bound_target(target, draft):
    """The target a draft is bound to (EagleDraft and MedusaDraft read its hidden states; an EarlyExitDraft with
    share_cache shares its cache): the handle it was built on, also when the decoder is given its transformers
    model; ValueError for any other. Any other draft: `target` as it is."""
    own = draft.target if isinstance(draft, (FeatureDraft, EarlyExitDraft)) else None
    if own is None or target is own or target is own.module:
        return target if own is None else own
    what = "reads the hidden states of" if isinstance(draft, FeatureDraft) else "shares the cache of"
    again = second_load(target, own)  # the same file loaded anew: say so, rather than "pass" what was passed
    if again:
        raise ValueError(f"draft: {type(draft).__name__} {what} the target it was built on ({own.source}); {again}")
    raise ValueError(f"draft: {type(draft).__name__} {what} the target it was built on ({own.source}); pass that "
                     "target (its speculant.Model or its transformers model), or build the draft on this one")


def _draft_confidence(value, draft, tree) -> float:
    """draft_confidence= as the drafter's stop (0.0: none); ValueError naming it where it cannot apply."""
    if value is None:
        return 0.0
    value = real(value, "draft_confidence")
    if not 0.0 < value <= 1.0:
        raise ValueError(f"draft_confidence must be a probability in (0, 1], got {value!r}")
    if not isinstance(draft, Model):
        raise ValueError(f"draft_confidence stops a draft model's chain, got a {type(draft).__name__} as the draft")
    if tree:
        raise ValueError("draft_confidence stops chains: a token tree's shape is laid out before its tokens are "
                         "drawn (leave tree= out, or draft_confidence)")
    return value


def _sibling_draft(value, draft, tree, siblings: str, device, dtype) -> Optional[Model]:
    """sibling_draft= as a speculant.Model, or None; ValueError naming it where it cannot draw siblings."""
    if value is None:
        return None
    if not isinstance(draft, Model):
        raise ValueError(f"sibling_draft needs a draft model beside it, got a {type(draft).__name__} as the draft")
    if not tree or isinstance(tree, DynamicTree):
        raise ValueError("sibling_draft draws the later children of a token tree of a fixed shape: give tree= as "
                         "children per depth or parents (not a chain, not a DynamicTree)")
    if siblings not in ("coupled", "with_replacement"):
        raise ValueError(f"sibling_draft: its children are independent draws, so siblings must be 'coupled' or "
                         f"'with_replacement', got {siblings!r}")
    sibling = as_model(value, "sibling_draft", device, dtype)
    if sibling is draft:
        raise ValueError("sibling_draft must be another model than the draft (each keeps its own cache)")
    return sibling


def _check_level(draft: "SpeculativeDecoder", settings: SamplingSettings) -> None:
    """A SpeculativeDecoder used as the draft samples at the outer call's settings (one standardization for every
    level, §2.2): refuses one built with other settings, which would otherwise be ignored."""
    for name in ("temperature", "top_k", "top_p"):
        if getattr(draft.sampling, name) != getattr(settings, name):
            raise ValueError(f"draft: a SpeculativeDecoder used as the draft samples at the outer decoder's settings "
                             f"(one standardization for every level, §2.2), but its {name} is "
                             f"{getattr(draft.sampling, name)!r} and the outer decoder's {getattr(settings, name)!r}: "
                             "build both with the same temperature, top_k and top_p (generate's overrides apply to "
                             "every level)")
    if draft.sampling.lenience != 1.0:
        raise ValueError(f"draft: a SpeculativeDecoder used as the draft must be exact (lenience 1), so that its "
                         f"output law is its model's own, got lenience {draft.sampling.lenience!r} (lenience "
                         "is allowed at the top level only)")


def check_settings(*, gamma: int = DEFAULT_GAMMA, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                   lenience: float = 1.0, verification: str = "token") -> dict:
    """The sampling settings as a decoder takes them, checked: ValueError naming a bad one (gamma < 1,
    temperature < 0 or NaN, top_k < 0, top_p outside (0, 1], lenience outside (0, 1], a verification not in
    VERIFICATIONS or "block" with lenience below 1). Returns the sampling settings as a dict. What a program that
    loads its models slowly calls first."""
    integer(gamma, "gamma", 1)
    settings = SamplingSettings(temperature, top_k, top_p, lenience)
    _verification(verification, None, settings)
    return settings.as_dict()


GAMMA_POLICIES = ("fixed", "heuristic", "alpha")


def _schedule(gamma_policy, max_gamma, cost) -> dict:
    if not isinstance(gamma_policy, str) or gamma_policy not in GAMMA_POLICIES:
        raise ValueError(f"gamma_policy must be one of {GAMMA_POLICIES}, got {gamma_policy!r}")
    if max_gamma is not None:
        max_gamma = integer(max_gamma, "max_gamma", 1)
    if gamma_policy == "alpha" and cost is None:
        raise ValueError("gamma_policy='alpha' needs cost, the draft-to-target time ratio c (Theorem 3.8)")
    return {"gamma_policy": gamma_policy, "max_gamma": max_gamma, "cost": 0.0 if cost is None else
            real(cost, "cost")}


def _prompt(prompt_ids, input_ids):
    if input_ids is not None:
        if prompt_ids is not None:
            raise ValueError("pass the prompt once: prompt_ids or input_ids (its transformers name), not both")
        return input_ids
    return prompt_ids


def _sampling(base: SamplingSettings, do_sample, temperature, top_k, top_p) -> SamplingSettings:
    """The decoder's sampling settings with a call's overrides, transformers' way: do_sample=False is argmax;
    do_sample=True samples (at temperature 1 if the decoder's is argmax and none is given)."""
    changes = {}
    if temperature is not None:
        changes["temperature"] = real(temperature, "temperature")
    if top_k is not None:
        changes["top_k"] = integer(top_k, "top_k", 0)
    if top_p is not None:
        changes["top_p"] = real(top_p, "top_p")
    if do_sample is not None:
        if not flag(do_sample, "do_sample"):
            changes["temperature"] = 0.0
        elif changes.get("temperature", base.temperature) == 0.0:
            if temperature is not None:
                raise ValueError("do_sample=True with temperature=0: sampling needs a temperature > 0")
            changes["temperature"] = 1.0
    return base.replace(**changes)


def _unpadded(ids: List[int], mask, name: str, row: int) -> List[int]:
    """Row `row` of a padded batch without its padding: the ids where the attention mask is 1, which must be
    one contiguous run (left or right padding; both suit every model, since each row runs unpadded)."""
    mask = [int(m) for m in mask]
    if len(mask) != len(ids):
        raise ValueError(f"{name}: attention_mask row {row} has {len(mask)} entries and the ids {len(ids)}: the mask "
                         "must match its ids")
    if any(m not in (0, 1) for m in mask):
        raise ValueError(f"{name}: attention_mask row {row} must hold only 0 and 1, got {sorted(set(mask))}")
    kept = [i for i, m in enumerate(mask) if m]
    if not kept:
        raise ValueError(f"{name} is empty: its attention_mask row is all 0 (every prompt needs a token)")
    if kept[-1] - kept[0] + 1 != len(kept):
        raise ValueError(f"{name}: attention_mask row {row} has 0s between its 1s: only left or right padding is "
                         "allowed, one contiguous run of tokens per row")
    return ids[kept[0]:kept[-1] + 1]


def _pad_id(tokenizer, target: Model) -> Optional[int]:
    """The pad id a padded batch would hold: the tokenizer's (a transformers tokenizer's pad_token_id, a
    tokenizers.Tokenizer's padding), else the target's metadata's, or None."""
    padding = getattr(tokenizer, "padding", None)
    for value in (getattr(tokenizer, "pad_token_id", None), padding.get("pad_id") if isinstance(padding, dict)
                  else None, target.metadata.get("pad_token_id")):
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return int(value)
    return None


def _refuse_padding(rows: List[List[int]], name: str, pad_id: Optional[int]) -> None:
    """Refuses a batch of equal-length rows without attention_mask that looks padded: some rows, but not all,
    begin (left padding) or end (right padding) with the pad id. Its padding would be decoded as prompt tokens.
    All rows beginning with it (a BOS or decoder start that is also the pad id) is no padding: the longest row
    of a padded batch has none."""
    if pad_id is None or len(rows) < 2 or len({len(row) for row in rows}) != 1:
        return
    for side, index in (("begins", 0), ("ends", -1)):
        padded = [row[index] == pad_id for row in rows]
        if any(padded) and not all(padded):
            raise ValueError(
                f"{name} is a [{len(rows)}, {len(rows[0])}] batch without attention_mask, and row "
                f"{padded.index(True)} {side} with the pad id {pad_id} while row {padded.index(False)} does not: it "
                "looks padded, and its padding would be decoded as prompt tokens. Pass the batch's attention_mask "
                "(a tokenizer's output carries it; all 1s when no row is padded), or the prompts unpadded as a list "
                "of lists of their own lengths")


PROMPT_FORMS = ("pass one prompt (token ids as a list, a 1-D or [1, T] tensor or array) or a batch (a list of 1-D "
                "prompts, or a [B, T] tensor or array)")


def _too_deep(name: str, what: str) -> ValueError:
    """The error for prompts nested deeper than a batch: a 3-D tensor, a list of lists of lists, a list of 2-D
    tensors. Lists and tensors are refused alike, rather than a list's extra level being taken as a batch of one."""
    return ValueError(f"{name} nests deeper than a batch ({what}): {PROMPT_FORMS}")


def _array(value) -> str:
    """A tensor or array described by its shape: "a 3-D tensor of shape [1, 1, 2]"."""
    kind = "tensor" if isinstance(value, torch.Tensor) else "array"
    return f"a {value.ndim}-D {kind} of shape {list(value.shape)}"


def _nesting(row) -> str:
    """What makes a batch's row more than one prompt's ids ("" when nothing does): a 2-D or deeper tensor or
    array, or a sequence of sequences."""
    if isinstance(row, (torch.Tensor, np.ndarray)) and row.ndim >= 2:
        return _array(row)
    if isinstance(row, (list, tuple)) and any(isinstance(v, (list, tuple)) or (
            isinstance(v, (torch.Tensor, np.ndarray)) and v.ndim >= 1) for v in row):
        return f"a {type(row).__name__} of sequences"
    return ""


def _rows(value, name: str, tokenizer=None, attention_mask=None,
          pad_id: Optional[int] = None) -> Tuple[List[List[int]], bool]:
    """The prompts in `value` and whether it is a batch. A batch is a list of prompts (token-id lists, 1-D
    tensors, strings with a tokenizer), a 2-D tensor or array, or a tokenizer's output (a mapping with
    input_ids); a padded one comes with its attention mask (in the mapping, or `attention_mask`). One row is
    one prompt (tokenizers return a batch of one), not a batch. Deeper nesting (a 3-D tensor, a row that is a list
    of lists or a 2-D tensor) is refused (_too_deep). A batch without a mask that looks padded with `pad_id` is
    refused (_refuse_padding)."""
    if isinstance(value, Mapping) and "input_ids" in value:
        if attention_mask is not None:
            raise ValueError(f"{name} is a mapping with its own attention_mask: do not pass attention_mask too")
        attention_mask, value = value.get("attention_mask"), value["input_ids"]
    if isinstance(value, (torch.Tensor, np.ndarray)) and value.ndim > 2:
        raise _too_deep(name, _array(value))
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if isinstance(value, torch.Tensor) and value.dim() == 2:
        if value.dtype.is_floating_point or value.dtype == torch.bool:
            raise ValueError(f"{name} must hold integer token ids, got a {value.dtype} tensor")
        value = value.tolist()
    rows = value if isinstance(value, (list, tuple)) and value and not all(
        isinstance(v, numbers.Integral) for v in value) else None
    if rows is None:
        ids = token_ids(value, name, tokenizer)
        if attention_mask is not None:  # one prompt with its mask (a tokenizer's output without tensors)
            mask = attention_mask.tolist() if isinstance(attention_mask, (torch.Tensor, np.ndarray)) else attention_mask
            if not isinstance(mask, (list, tuple)) or not all(isinstance(m, numbers.Integral) for m in mask):
                raise ValueError(f"attention_mask must have the shape of {name}: one 0/1 entry per token id")
            ids = _unpadded(ids, mask, name, 0)
        return [ids], False
    if attention_mask is not None:
        if isinstance(attention_mask, np.ndarray):
            attention_mask = torch.from_numpy(attention_mask)
        masks = attention_mask.tolist() if isinstance(attention_mask, torch.Tensor) else list(attention_mask)
        if len(masks) != len(rows) or not all(isinstance(m, (list, tuple)) for m in masks):
            raise ValueError(f"attention_mask must be 2-D with one row per {name} row ({len(rows)} rows)")
    out = []
    for r, row in enumerate(rows):
        label = name if len(rows) == 1 else f"{name}[{r}]"
        if row is None:
            raise ValueError(f"{label} is None: every row of a batch needs its own ids")
        nesting = _nesting(row)
        if nesting:
            raise _too_deep(name, f"{name}[{r}] is {nesting}")
        ids = token_ids(row, label, tokenizer)
        if attention_mask is not None:
            ids = _unpadded(ids, masks[r], label, r)
        if not ids:
            raise ValueError(f"{label} is empty: every prompt needs at least one token")
        out.append(ids)
    if attention_mask is None and not any(isinstance(row, str) for row in rows):  # strings have no padding
        _refuse_padding(out, name, pad_id)
    return out, len(rows) > 1


@dataclass(frozen=True)
class DynamicTree:
    """``tree=`` for a token tree grown while it is drafted, by the draft's confidence under a node budget
    (EAGLE-2, Li et al. 2024; cpp/drafting/tree_growth.h). A node's value is its path's draft log probability (at
    temperature 0 under the softmax of the draft's raw logits). Level by level, the ``width`` nodes of the newest
    depth with the highest values each get ``children`` children, drawn as a fixed tree's are (by the decoder's
    ``siblings``; the draft's top ``children`` at temperature 0), until ``budget`` drafts are placed or
    the tree is ``depth`` deep (the decoder's gamma). Exact at every setting: each level's shape is chosen from
    the nodes drawn before it, never by dropping drawn children, which is why EAGLE-2's final reranking of the
    tree is left out. Each iteration's tree is in the trace (``Iteration.tree``, breadth-first parents)."""

    budget: int = 16
    depth: int = 6
    children: int = 2
    width: int = 4

    def __post_init__(self):
        integer(self.budget, "DynamicTree budget", 1, 4096)
        for name in ("depth", "children", "width"):
            integer(getattr(self, name), f"DynamicTree {name}", 1, 4096)


def _tree(value) -> Union[List[int], DynamicTree]:
    """tree= as the engine takes it: [] (a chain), [k_1 .. k_d], each >= 1 (cpp/math/tree.h), breadth-first parents
    [-1, p_1, ..., p_N] (any tree; analysis.best_tree's or optimal_tree's result may be given whole), or a
    DynamicTree."""
    if value is None:
        return []
    if isinstance(value, DynamicTree):
        return value
    if isinstance(value, (TreeChoice, TreeSpeedup)):
        value = value.tree
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise ValueError(f"tree must be a non-empty list of children per depth [k_1, ..., k_d] (each >= 1; "
                         f"[1] * gamma is the chain), breadth-first parents [-1, p_1, ..., p_N] or a "
                         f"speculant.DynamicTree, got {value!r}")
    if isinstance(value[0], numbers.Integral) and not isinstance(value[0], bool) and value[0] == -1:
        parents = tree_parents(list(value))  # validated: breadth-first, each parent before its child
        if not 2 <= len(parents) <= 4097:
            raise ValueError(f"tree: parents must give 1 to 4096 drafts, got {len(parents) - 1}")
        return [int(v) for v in parents]
    return [integer(k, f"tree[{i}]", 1, 64) for i, k in enumerate(value)]


def tree_gamma(tree) -> int:
    """The gamma a tree runs at: its depth. The tree is a DynamicTree or a list as _tree returns it."""
    if isinstance(tree, DynamicTree):
        return tree.depth
    return tree_depth(tree) if tree and tree[0] == -1 else len(tree)


def _eos_ids(value) -> List[int]:
    """eos_token_id as the engine takes it: None, one id, or several (Llama 3 stops at any of its EOS ids)."""
    if value is None:
        return []
    if isinstance(value, torch.Tensor):
        if value.dim() > 1 or value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
            raise ValueError(f"eos_token_id must be an integer or a sequence of integers, got a {value.dtype} tensor "
                             f"of shape {list(value.shape)}")
        value = value.tolist()
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return [integer(value, "eos_token_id", 0)]
    if isinstance(value, (list, tuple)) and value:
        return [integer(v, f"eos_token_id[{i}]", 0) for i, v in enumerate(value)]
    raise ValueError(f"eos_token_id must be an integer >= 0 or a non-empty sequence of them, got {value!r}")


def _new_tokens(max_new_tokens, max_length, longest: int, minimum: int) -> int:
    """max_new_tokens, or transformers' max_length (the prompt included; a batch's longest prompt, as transformers
    counts its padded input) turned into it; checked (the engine adds the prompt's length to it in int64)."""
    if max_length is None:
        if max_new_tokens is None:
            raise ValueError("max_new_tokens is required: the number of tokens to generate after the prompt (or "
                             "max_length=, transformers' total length with the prompt)")
        return integer(max_new_tokens, "max_new_tokens", minimum, INT64_MAX - longest)
    if max_new_tokens is not None:
        raise ValueError(f"pass max_new_tokens or max_length, not both (got {max_new_tokens!r} and {max_length!r})")
    total = integer(max_length, "max_length", 1)
    if total - longest < minimum:
        raise ValueError(f"max_length counts the prompt, as in transformers: it must be at least the prompt's "
                         f"length {longest} + {minimum}, got {total} (or pass max_new_tokens=)")
    return total - longest


def _run(decoder: _core.Decoder, target: Model, prompt_ids, encoder_input_ids, max_new_tokens, eos_token_id,
         seed, profile, schedule=None, tokenizer=None, attention_mask=None,
         max_length=None) -> Union[Result, List[Result]]:
    tokenizer = checked_tokenizer(tokenizer)
    prompts, sources, batch = _prompts_and_sources(target, prompt_ids, encoder_input_ids, tokenizer, attention_mask)
    max_new_tokens = _new_tokens(max_new_tokens, max_length, max(len(p) for p in prompts), 0)
    eos = _eos_ids(eos_token_id)
    seed = None if seed is None else integer(seed, "seed", 0, 2**64 - 1)
    generations = decoder.generate_batch(prompts, sources, max_new_tokens, eos, seed, flag(profile, "profile"),
                                         **(schedule or {}))
    results = []
    for generation in generations:
        tokens = list(generation.tokens)
        text = None if tokenizer is None else tokenizer.decode(tokens)
        results.append(Result(tokens=tokens, stats=generation.stats, trace=Trace(generation.trace), text=text,
                              levels=tuple(generation.levels)))
    return results if batch else results[0]


def _prompts_and_sources(target: Model, prompt_ids, encoder_input_ids, tokenizer, attention_mask):
    """(prompts, sources, batch): the rows of prompt_ids and encoder_input_ids (sources [] for decoder-only
    models; an encoder-decoder's prompts default to its decoder start, one for every source), checked."""
    encoder_decoder = encoder_input_ids is not None
    pad_id = _pad_id(tokenizer, target)
    sources, source_batch = ([], False) if not encoder_decoder else _rows(  # an encoder-decoder's mask: its source's
        encoder_input_ids, "encoder_input_ids", tokenizer, attention_mask, pad_id)
    if prompt_ids is None:
        prompts, batch = [[_start(target)]] * max(len(sources), 1), source_batch
    else:
        prompts, batch = _rows(prompt_ids, "prompt_ids", tokenizer, None if encoder_decoder else attention_mask,
                               pad_id)
        if encoder_decoder and not batch and source_batch:  # one decoder start for every source
            prompts, batch = prompts * len(sources), True
    if encoder_decoder and len(sources) != len(prompts):
        raise ValueError(f"prompt_ids holds {len(prompts)} prompts and encoder_input_ids {len(sources)} sources: "
                         "pass one source per prompt (or one decoder start for every source)")
    return prompts, sources, batch


def _beam_options(num_beams, draft_beams, length_penalty, early_stopping, num_return_sequences) -> Optional[dict]:
    """Beam search's checked options (speculant.beams), or None without num_beams >= 2 (then the others must be
    left at their defaults)."""
    if num_beams is None or (isinstance(num_beams, numbers.Integral) and not isinstance(num_beams, bool)
                             and num_beams == 1):
        for name, value, default in (("draft_beams", draft_beams, None), ("length_penalty", length_penalty, 1.0),
                                     ("early_stopping", early_stopping, False),
                                     ("num_return_sequences", num_return_sequences, 1)):
            if value is not default and not (type(value) is type(default) and value == default):
                raise ValueError(f"{name}={value!r} applies to beam search: pass num_beams >= 2 too")
        return None
    return beams.options(num_beams, draft_beams, length_penalty, early_stopping, num_return_sequences)


def _beam_search(target: Model, draft: Optional[Model], gamma: int, beam: dict, prompt_ids, encoder_input_ids,
                 max_new_tokens, eos_token_id, tokenizer, attention_mask, max_length=None):
    tokenizer = checked_tokenizer(tokenizer)
    prompts, sources, batch = _prompts_and_sources(target, prompt_ids, encoder_input_ids, tokenizer, attention_mask)
    max_new_tokens = _new_tokens(max_new_tokens, max_length, max(len(p) for p in prompts), 1)
    return beams.search(target.engine, None if draft is None else draft.engine, gamma, prompts, sources or None,
                        batch, max_new_tokens, _eos_ids(eos_token_id), tokenizer, beam)


def _start(target: Model) -> int:
    start = target.decoder_start_token_id
    if start is None:
        raise ValueError("prompt_ids is required (only an encoder-decoder model with a "
                         "decoder_start_token_id in its metadata starts by itself)")
    return start


class SpeculativeDecoder:
    """Speculative decoding of ``target`` with ``draft`` proposing ``gamma`` tokens per iteration.

    target and draft: anything ``speculant.load`` takes (a transformers model object, a save_pretrained
    directory, a .pt / .pt2 file, a speculant.Model); draft may also be a drafter from speculant.drafters.
    ``device`` / ``dtype`` are passed to ``speculant.load`` for those not loaded yet.

    One sampling configuration standardizes both models (§2.2): temperature (0 = argmax; default 1.0), top_k
    (0 = off, the default), top_p (1 = off, the default); ``generate`` may override it per call. lenience in
    (0, 1] (A.5): 1 (the default) is exact; below 1 no token is sampled with probability above p(x) / lenience
    (argmax: a draft token is kept when p(x) >= lenience * max p). gamma defaults to DEFAULT_GAMMA = 4.
    ``sampling``: the four as one speculant.SamplingSettings, as transformers takes a generation_config; a keyword
    given explicitly overrides its field (``SpeculativeDecoder(t, d, sampling=s, top_k=5)`` is s with top_k 5).

    ``tree=[k_1, ..., k_d]`` drafts a token tree instead of a chain (cpp/math/tree.h): each node of depth i gets k_i
    children from the draft's q there, by ``siblings``: "coupled" (the default: independent draws, each
    child's acceptance coin looking at whether the next child could be accepted after it, so the first child
    keeps its chance and the later ones gain, cpp/math/tree.h; on benchmarks/trees.py's GPT-2 pair the most tokens
    per target call of the four), "without_replacement" (distinct siblings, recursive rejection sampling),
    "with_replacement" (independent draws, independent coins) or "top" (q's k_i - 1 most probable tokens, then
    one draw from q without them: better for a draft whose argmax is right but whose mass is spread, worse for
    one close to the target in law, as on that pair); at temperature 0 they are the draft's top k_i whatever
    ``siblings`` says. A chain is the same under all four.
    ``tree=[-1, p_1, ..., p_N]`` gives any tree by its breadth-first parents (node i's parent p_i < i, siblings
    contiguous), e.g. Sequoia's best tree of a node budget: ``tree=analysis.best_tree(16, table)`` (the result
    of analysis.best_tree or optimal_tree may be passed whole). The whole tree is verified in one target call
    with multi-draft speculative sampling, which keeps the output law exactly the target's. gamma is then the
    depth d. ``tree=speculant.DynamicTree(budget, depth, children, width)`` grows each iteration's tree by the
    draft's confidence instead (EAGLE-2's expansion, exact: see DynamicTree). Trees need models with tree
    calls (speculant.export's files, live decoder-only transformers models; ``Model.tree_obstacle`` says why
    not), a draft model, a Unigram / Bigram table or a PythonDrafter with ``score`` (``tree_obstacle`` on
    drafters too), lenience 1 and the fixed gamma policy. With cuda_graphs, a tree's calls are shaped as a chain's:
    "fixed" runs every tree call over every row and cache slot (its mask [rows, width, max_length]), and "auto" /
    "on" capture one graph per width of tree call; the moves of the accepted path's cache entries run uncaptured.
    The statistics count each depth's and rank's acceptances (``stats.tree_visits``, ``stats.tree_accepted``, and
    ``stats.tree_offered``: how often a visited node had that rank; timing.tree_table estimates from all three).

    ``cuda_graphs`` ("off", "auto", "on", "fixed"; speculant.graphs): "off" (the default) captures nothing.
    With "auto" on CUDA each model's fixed-shape calls (the draft's step, the target's verification of each
    width, a tree's masked calls of each width) are captured once into CUDA graphs and replayed; a model whose
    backend cannot be captured runs as before, with a warning saying why; "on" makes that an error. The tokens
    are those of the same fixed-shape calls uncaptured ("fixed"); the law is the target's. On accelerators the
    verification's device work (the residuals, the candidates, the read-back's packing; a tree's every step) runs
    through fixed-shape buffers too, keyed by the rows' drafts (a chain's lengths, a tree's shape; not for a
    DynamicTree), one CUDA graph per key with "auto" / "on" (a failed capture warns once, and the work runs
    uncaptured), and a draft model's steps draw their tokens inside the step's call (its graph; a fixed tree's
    level calls their children). The uniforms are drawn outside the graphs, from the same generators, so the
    tokens are those of "off". "auto" has run on leased H100 and H200 GPUs (BENCHMARKS.md: the tokens of "off",
    the verification's graphs and the drawing inside the draft's calls included).

    ``draft`` may itself be a SpeculativeDecoder, to any depth (a hierarchical draft, cpp/drafting/hierarchy.h):
    ``SpeculativeDecoder(target, SpeculativeDecoder(draft, smaller, gamma=2), gamma=4)``. Each iteration asks the
    draft level for exactly gamma tokens, which it produces by speculative decoding of its own pair, reporting its
    model's standardized law at each token as q: the output law stays exactly the target's. Every level samples
    at this decoder's settings (and generate's overrides), so a level built with another temperature, top_k or
    top_p is refused, as is one with lenience below 1 or a tree. A level keeps its own gamma and gamma policy.
    ``Result.levels`` holds each level's statistics; the trace shows each level's iterations.

    ``gamma_policy``, ``max_gamma``, ``cost``: the defaults of ``generate``'s (see there), and the schedule this
    decoder's gamma follows when it is another decoder's draft level.

    ``sibling_draft``: a second draft model for a tree's later children (cpp/math/tree.h, sibling drafts): each node's
    first child is drawn from the draft's q, its others independently from the sibling draft's law at the same node
    (its own cache, fed the same tree nodes down to the deepest level that branches; deeper, every node has one
    child, the draft's), and verified against that law, so the output law stays exactly the
    target's. It pays where the sibling's law is closer than q to what a rejection of the first child leaves,
    norm(max(0, p - q)): a copy of the draft trained toward that residual
    (``speculant.distill(..., loss="residual", beside=draft)``). Trees of a fixed shape only, with siblings
    "coupled" or "with_replacement"; at temperature 0 the later children are the sibling's most probable tokens.
    Each tree level down to the deepest that branches costs one call of each draft model, the deeper ones the
    draft's alone: ``stats.draft_calls`` counts both, ``analysis.tree_draft_calls(tree, sibling=True)`` says how
    many, and ``speculant.sweep(..., sibling_draft=)`` prices such trees with it.

    ``draft_confidence`` (a probability; None: off): a draft model's chain stops after a token its q gave less than
    this (at temperature 0, where q is a point mass: the draft's softmax), so gamma is the most each iteration
    drafts (transformers' ``assistant_confidence_threshold``, 0.4 in its assisted generation). The stop reads only
    the draft's own logits and draws, so the output law stays exactly the target's (cpp/drafting/model_drafter.h).
    Chains of a draft model only. On an accelerator each draft step then reads one number per row back to the host.

    ``verification``: how a chain's drafts are verified. "token" (the default) is the paper's Algorithm 1, which
    stops at the first rejection. "block" is block verification (Sun et al., ICLR 2025, arXiv 2403.10444): it
    verifies the chain jointly, keeps at least as many drafts in expectation (never fewer tokens per target call),
    and is exact too (the proof in cpp/math/tree.h). At temperature 0 both give the same tokens. On a tree=
    of fixed shape "block" is traversal verification (Weng et al., NeurIPS 2025, arXiv 2505.12398: leaf to root,
    sequence-level; on a chain it is the block rule), with siblings "with_replacement", "without_replacement" or
    "top" (not "coupled", the trees' default, and not grown trees). "block" takes lenience 1.

    ``draft_tokenizer`` with ``target_tokenizer``: a draft model whose vocabulary differs from the target's
    drafts through text (speculant.cross_tokenizer.CrossTokenizer: deterministic proposals with point-mass q,
    so the law stays exactly the target's at every setting, and at temperature 0 the output is the target's
    greedy decoding token for token).
    """

    def __init__(self, target, draft, *, gamma: Optional[int] = None, tree: Optional[Sequence[int]] = None,
                 siblings: str = "coupled", temperature: Optional[float] = None, top_k: Optional[int] = None,
                 top_p: Optional[float] = None, lenience: Optional[float] = None, device=None, dtype=None,
                 cuda_graphs: str = "off", draft_tokenizer=None, target_tokenizer=None, gamma_policy: str = "fixed",
                 max_gamma: Optional[int] = None, cost: Optional[float] = None, sibling_draft=None,
                 draft_confidence: Optional[float] = None, sampling: Optional[SamplingSettings] = None,
                 verification: str = "token"):
        # temperature, top_k, top_p, lenience: None is "not given" (sampling's field, else 1.0, 0, 1.0, 1.0)
        self.target = as_model(bound_target(target, draft), "target", device, dtype)
        self.draft = _draft(draft, device, dtype)
        self._schedule = _schedule(gamma_policy, max_gamma, cost)
        if draft_tokenizer is not None or target_tokenizer is not None:
            self.draft = _cross_tokenizer(self.draft, draft_tokenizer, target_tokenizer, self.target)
        self._tree = _tree(tree)
        if self._tree and getattr(self.draft, "kind", None) == "cross_tokenizer":
            raise ValueError("tree: a draft with another tokenizer (draft_tokenizer= and target_tokenizer=, "
                             "speculant.cross_tokenizer.CrossTokenizer) proposes chains only: its proposal is one "
                             "sequence re-read from the draft's text, with no law for the other children of a "
                             "tree node. Leave tree= out (gamma= sets the chain's length)")
        if self._tree and gamma is not None and gamma != tree_gamma(self._tree):
            raise ValueError(f"gamma must be the tree's depth {tree_gamma(self._tree)} with tree={self._tree} (or "
                             f"left out), got {gamma!r}")
        gamma = tree_gamma(self._tree) if self._tree else DEFAULT_GAMMA if gamma is None else gamma
        self._gamma = integer(gamma, "gamma", 1)
        self._siblings = _siblings(siblings)
        self._settings = overridden(sampling, temperature=temperature, top_k=top_k, top_p=top_p, lenience=lenience)
        self._verification = _verification(verification, self._tree, self._settings, self._siblings)
        if isinstance(self.draft, SpeculativeDecoder):
            _check_level(self.draft, self._settings)
        self.sibling_draft = _sibling_draft(sibling_draft, self.draft, self._tree, self._siblings, device, dtype)
        self._draft_confidence = _draft_confidence(draft_confidence, self.draft, self._tree)
        self._drafter = _drafter(self.draft, self.sibling_draft, self._draft_confidence)
        mode = self._mode = graphs.check_mode(cuda_graphs)
        self._models = [self.target] + ([self.draft] if isinstance(self.draft, Model) else [])
        chosen = [graphs.shapes(model.engine, mode, role) for model, role in zip(self._models, ("target", "draft"))]
        warnings = [why for _, why in chosen]
        if self.sibling_draft is not None:  # it runs with the draft's shapes
            shape, why = graphs.shapes(self.sibling_draft.engine, mode, "sibling draft")
            if shape != chosen[1][0]:
                raise ValueError(f"sibling_draft: with cuda_graphs={mode!r} its calls would run {shape}, the "
                                 f"draft's {chosen[1][0]}: both run with the same shapes"
                                 + (f" ({why})" if why else ""))
            self._models.append(self.sibling_draft)
            warnings.append(why)
        self._shapes = [shape for shape, _ in chosen] + ["dynamic"] * (2 - len(chosen))
        if isinstance(self.draft, SpeculativeDecoder):  # its model runs as that decoder chose (and warned)
            self._shapes[1] = self.draft.shapes[0]
            self._models += self.draft._models
        self._core = self._decoder(self._settings)
        graphs.warn(warnings)

    def _decoder(self, settings: SamplingSettings) -> _core.Decoder:
        grown = self._tree if isinstance(self._tree, DynamicTree) else None
        return _core.Decoder(self.target.engine, self._drafter, self._gamma, settings.temperature, settings.top_k,
                             settings.top_p, settings.lenience, *self._shapes,
                             tree=[] if grown else self._tree, siblings=self._siblings,
                             growth=(grown.budget, grown.depth, grown.children, grown.width) if grown else None,
                             verification=self._verification)

    def with_sampling(self, temperature: float, top_k: int = 0, top_p: float = 1.0) -> "SpeculativeDecoder":
        """This decoder (its models, drafter, gamma, tree, lenience, gamma policy, draft_confidence and CUDA graphs
        mode) at other sampling settings, its draft levels too when the draft is a SpeculativeDecoder: what a
        sweep's settings need of a hierarchical draft."""
        draft = self.draft.with_sampling(temperature, top_k, top_p) if isinstance(self.draft, SpeculativeDecoder) \
            else self.draft
        return SpeculativeDecoder(self.target, draft, gamma=self._gamma, tree=self._tree or None,
                                  siblings=self._siblings, sampling=SamplingSettings(
                                      temperature, top_k, top_p, self._settings.lenience), cuda_graphs=self._mode,
                                  sibling_draft=self.sibling_draft, draft_confidence=self._draft_confidence or None,
                                  verification=self._verification, **self._schedule)

    @property
    def sampling(self) -> SamplingSettings:
        """The settings this decoder samples and verifies at (a generate call may override them for itself)."""
        return self._settings

    @property
    def verification(self) -> str:
        """How a chain's drafts are verified: "token" (Algorithm 1) or "block" (Sun et al.'s block verification)."""
        return self._verification

    @property
    def shapes(self) -> Tuple[str, str]:
        """How the target's and the draft's calls run: "graphed" (CUDA graphs), "fixed" (fixed shapes, not
        captured) or "dynamic" (speculant.graphs)."""
        return self._shapes[0], self._shapes[1]

    @property
    def gamma(self) -> int:
        return self._gamma

    def generate(self, prompt_ids: Optional[PromptIds] = None, *, max_new_tokens: Optional[int] = None,
                 max_length: Optional[int] = None,
                 input_ids: Optional[PromptIds] = None, encoder_input_ids: Optional[PromptIds] = None,
                 eos_token_id: Union[int, Sequence[int], None] = None, seed: Optional[int] = None,
                 profile: bool = False, gamma_policy: Optional[str] = None, max_gamma: Optional[int] = None,
                 cost: Optional[float] = None,
                 do_sample: Optional[bool] = None, temperature: Optional[float] = None,
                 top_k: Optional[int] = None, top_p: Optional[float] = None, tokenizer: Any = None,
                 attention_mask: Optional[PromptIds] = None, num_beams: Optional[int] = None,
                 draft_beams: Optional[int] = None, length_penalty: float = 1.0,
                 early_stopping: Union[bool, str] = False, num_return_sequences: int = 1,
                 sampling: Optional[SamplingSettings] = None) -> Union[Result, List[Result], beams.BeamResult,
                                                                       List[beams.BeamResult]]:
        """Generates up to ``max_new_tokens`` tokens after ``prompt_ids``, stopping after ``eos_token_id`` (one
        id, or several: a row stops just after any of them, as with Llama 3's several end tokens). Or
        ``max_length``, as transformers names it: the total length with the prompt (a batch's longest prompt;
        an encoder-decoder's decoder start); one of the two is required.

        The prompt (``prompt_ids``, or ``input_ids`` as transformers names it): token ids as a list, a 1-D or
        [1, T] tensor or numpy array, a tokenizer's output (a BatchEncoding), or a string with ``tokenizer=``
        (a transformers tokenizer or a tokenizers.Tokenizer), which also decodes ``result.text``.

        A batch returns a list of Results, one per row: a list of prompts (of any lengths), a [B, T] tensor or
        array with B > 1, or a tokenizer's output with several rows; a padded batch comes with its
        ``attention_mask`` (inside a BatchEncoding, or as this argument), left or right padding alike. A batch
        of equal-length rows without a mask that looks padded (some rows, not all, begin or end with the pad id:
        the tokenizer's pad_token_id, else the target's) is refused with ValueError, since its padding would be
        decoded as prompt tokens: pass its attention_mask (all 1s when nothing is padded) or the unpadded
        prompts as a list of lists. An encoder-decoder's sources are checked the same way. Each row
        drafts, verifies, accepts and stops on its own, with its own gamma policy, statistics and trace, and
        gets what it would get alone with seed ``seed + row``: its law is the target's own. In float32 that is
        token for token; in bf16 / fp16 a batched call may round its logits differently from a batch-1 call, so a
        row may differ from its batch-1 run while its law stays that of the target as the batch computes it.
        Models exported by speculant.export (GPT-2, Llama, TinyGPT) run each step as one call for the rows still
        running (the batched form of docs/model-contract.md: ``start_rows`` / ``extend_rows``); other backends
        run a batch as one model replica per row, called in turn. Nesting deeper than a batch (a 3-D tensor, a
        list of lists of lists) is refused with ValueError.

        ``do_sample``, ``temperature``, ``top_k``, ``top_p`` override the decoder's settings for this call
        (do_sample=False is argmax); both models are standardized with the same settings, as always.
        ``sampling`` (a speculant.SamplingSettings, as transformers' generation_config) replaces the decoder's
        settings for this call, all four (lenience too); those keywords, given, override its fields.

        Encoder-decoder pairs (T5) take the source as ``encoder_input_ids``, encoded once per model and
        generation; ``prompt_ids`` is then the decoder's start and defaults to the target's
        ``decoder_start_token_id``.

        The same seed and inputs give the same tokens; without a seed one is drawn and reported in
        ``result.stats.seed``. ``profile=True`` synchronizes a GPU around model calls so that the draft /
        target / other time split is exact (it adds synchronizations; on CPU it changes nothing).

        Adaptive gamma (the decoder's gamma is then the start): ``gamma_policy="heuristic"`` adds 2 after an
        iteration that kept every draft and removes 1 otherwise, within [1, max_gamma]; ``"alpha"`` tracks
        alpha by a moving average of beta and drafts the gamma <= max_gamma that maximizes Theorem 3.8's
        improvement for the given ``cost`` c. max_gamma defaults to 2 * gamma. A policy sees only earlier
        iterations, so the output law stays exact. Left out, the three are the decoder's (its constructor's).

        Speculative beam search (A.4): ``num_beams=w`` (>= 2) returns the target's beam search, exactly
        transformers' ``generate(num_beams=w, do_sample=False)`` with the same ``length_penalty``,
        ``early_stopping`` (False, True or "never"), ``eos_token_id`` and ``num_return_sequences``, as a
        speculant.beams.BeamResult (one per prompt of a batch). The draft model runs its own beam search of width
        ``draft_beams`` (default w) for gamma levels from the target's beams, one target call scores every
        candidate, and the target's steps run on those scores for as long as its beams stay among the
        candidates. The draft decides only how many steps a target call serves, never the result. It ranks the
        raw log-probabilities (the decoder's temperature, top_k and top_p do not apply; overriding them, seed,
        profile and the gamma policy are refused), needs a draft model (not a drafter or a hierarchical draft),
        no tree, lenience 1, and models that hold several beams in one cache (``Model.beam_obstacle``). An
        encoder-decoder's beams share the source (``encoder_input_ids``), each decoder starting at its start token.
        """
        beam = _beam_options(num_beams, draft_beams, length_penalty, early_stopping, num_return_sequences)
        if beam is not None:
            for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p), ("seed", seed),
                                ("gamma_policy", gamma_policy), ("max_gamma", max_gamma), ("cost", cost),
                                ("sampling", sampling)):
                beams.refuse(name, value)
            beams.refuse("do_sample", do_sample, allowed=False)
            beams.refuse("profile", profile, allowed=False)
            if not isinstance(self.draft, Model):
                raise ValueError(f"num_beams: speculative beam search needs a draft model, not a "
                                 f"{type(self.draft).__name__} (the draft runs beam search of its own)")
            if self._tree or self._settings.lenience != 1.0:
                raise ValueError("num_beams: beam search is built with neither tree= nor lenience below 1 (it "
                                 "is exact and drafts its own candidate tree): use a decoder without them")
            return _beam_search(self.target, self.draft, self._gamma, beam, _prompt(prompt_ids, input_ids),
                                encoder_input_ids, max_new_tokens, eos_token_id, tokenizer, attention_mask,
                                max_length)
        overrides = (do_sample, temperature, top_k, top_p)
        core = self._core if sampling is None and all(v is None for v in overrides) else self._decoder(
            _sampling(self._settings if sampling is None else overridden(sampling), *overrides))
        try:
            schedule = self._schedule if gamma_policy is None and max_gamma is None and cost is None else _schedule(
                self._schedule["gamma_policy"] if gamma_policy is None else gamma_policy,
                self._schedule["max_gamma"] if max_gamma is None else max_gamma,
                (self._schedule["cost"] if gamma_policy is None or gamma_policy == self._schedule["gamma_policy"]
                 else None) if cost is None else cost)
            return _run(core, self.target, _prompt(prompt_ids, input_ids), encoder_input_ids, max_new_tokens,
                        eos_token_id, seed, profile, schedule, tokenizer, attention_mask, max_length)
        finally:
            graphs.warn_failures(self._models)
            graphs.warn_verification_failure(core, self)


def generate(target, prompt_ids: Optional[PromptIds] = None, *, max_new_tokens: Optional[int] = None,
             max_length: Optional[int] = None,
             input_ids: Optional[PromptIds] = None, encoder_input_ids: Optional[PromptIds] = None,
             temperature: Optional[float] = None, top_k: Optional[int] = None, top_p: Optional[float] = None,
             do_sample: Optional[bool] = None,
             eos_token_id: Union[int, Sequence[int], None] = None, seed: Optional[int] = None, profile: bool = False,
             tokenizer: Any = None, attention_mask: Optional[PromptIds] = None,
             cuda_graphs: str = "off", num_beams: Optional[int] = None, length_penalty: float = 1.0,
             early_stopping: Union[bool, str] = False, num_return_sequences: int = 1,
             sampling: Optional[SamplingSettings] = None) -> Union[Result, List[Result], beams.BeamResult,
                                                                   List[beams.BeamResult]]:
    """Plain autoregressive decoding of ``target`` through the same engine (gamma = 0): the baseline.
    Arguments as in SpeculativeDecoder.generate (temperature 1.0, top_k 0, top_p 1.0 by default), and
    ``cuda_graphs`` as in SpeculativeDecoder. ``sampling``: those settings as one speculant.SamplingSettings
    (its lenience does not apply: plain decoding verifies nothing); temperature, top_k and top_p, given,
    override its fields. ``num_beams`` >= 2 runs the target's beam search alone (one target call per step), the
    baseline of speculative beam search."""
    target = as_model(target, "target")
    beam = _beam_options(num_beams, None, length_penalty, early_stopping, num_return_sequences)
    if beam is not None:
        beams.refuse("do_sample", do_sample, allowed=False)
        beams.refuse("seed", seed)
        beams.refuse("profile", profile, allowed=False)
        beams.refuse("cuda_graphs", cuda_graphs, allowed="off")
        for name, value, default in (("temperature", temperature, 1.0), ("top_k", top_k, 0), ("top_p", top_p, 1.0)):
            beams.refuse(name, None if value is None or value == default else value)
        beams.refuse("sampling", None if sampling is None or overridden(sampling).standardization() ==
                     SamplingSettings().standardization() else sampling)
        return _beam_search(target, None, 0, beam, _prompt(prompt_ids, input_ids), encoder_input_ids,
                            max_new_tokens, eos_token_id, tokenizer, attention_mask, max_length)
    settings = _sampling(overridden(sampling, temperature=temperature, top_k=top_k, top_p=top_p), do_sample,
                         None, None, None)
    shapes, why = graphs.shapes(target.engine, graphs.check_mode(cuda_graphs), "target")
    graphs.warn([why])
    decoder, lock = _plain_decoder(target, settings, shapes)
    try:
        return _run(decoder, target, _prompt(prompt_ids, input_ids), encoder_input_ids, max_new_tokens,
                    eos_token_id, seed, profile, tokenizer=tokenizer, attention_mask=attention_mask,
                    max_length=max_length)
    finally:
        if lock is not None:
            lock.release()
        graphs.warn_failures([target])
        graphs.warn_verification_failure(decoder, target)


PLAIN_DECODERS = 8  # plain decoders kept per model, by settings
# the kept plain decoders of each model handle, by settings: {(temperature, top_k, top_p, shapes): (decoder, lock)}
KEPT_PLAIN: "weakref.WeakKeyDictionary[Model, dict]" = weakref.WeakKeyDictionary()


def _plain_decoder(target: Model, sampling: SamplingSettings,
                   shapes: str) -> Tuple[_core.Decoder, Optional[threading.Lock]]:
    """The plain decoder of `target` at these settings, kept for the model handle (KEPT_PLAIN) so that its
    verification's buffers and graphs (cpp/device/verification_graphs.h) serve every call, with its lock held
    (release it after the call); a fresh decoder, without a lock, while another thread decodes with the kept one."""
    kept = KEPT_PLAIN.setdefault(target, {})
    key = (*sampling.standardization(), shapes)
    if key not in kept:
        if len(kept) >= PLAIN_DECODERS:
            kept.pop(next(iter(kept)))
        kept[key] = (_core.Decoder(target.engine, None, 0, *sampling.standardization(), 1.0, shapes),
                     threading.Lock())
    decoder, lock = kept[key]
    if lock.acquire(blocking=False):
        return decoder, lock
    return _core.Decoder(target.engine, None, 0, *sampling.standardization(), 1.0, shapes), None
