"""A draft model with another tokenizer than the target's, drafting through text.

The best small model for a target often has another vocabulary. ``CrossTokenizer`` proposes as transformers'
universal assisted generation does: the target's sequence so far is decoded to text with the target's
tokenizer, encoded with the draft's, continued greedily by the draft (through speculant's engine, any form
``speculant.load`` takes), and the text it added is encoded back with the target's tokenizer; the first γ of
those target tokens are the proposal. Tokens that split or merge differently at the boundary are handled by
re-encoding the whole text: when its encoding starts with the sequence's own tokens, the rest is the
proposal; otherwise the added text is encoded alone.

Exactness: the proposal is a deterministic function of the sequence so far, so the law it was drawn from is the
point mass on it, and that is the q the engine is given. Speculative sampling corrects for any q (§2.3), so the
output law is exactly the target's at every temperature, top-k, top-p and lenience; at temperature 0 the output
is the target's greedy decoding token for token. The cost is in α: with a point mass the acceptance of a
proposed x is min(1, p(x)), so β = p(x) instead of Σ_x min(p(x), q(x)), as for prompt lookup (§3.6). At
temperature 0 nothing is lost (β is 1 exactly when x is the target's argmax).

The draft keeps its KV cache between proposals: the re-encoded text mostly extends the previous one, so only the
draft tokens after the prefix it shares with the last call's are run (``_core.GreedyContinuation``). If another
generation ran on the same draft model in between, its cache length tells, and the whole sequence is run again;
a stale cache that slipped through would change only the proposals, which the target verifies, never the output.

``mode="intersection"`` samples instead, in the vocabularies' intersection (the idea of Timor et al., ICML 2025):
the tokens whose text is the same in both vocabularies are paired; each proposed token is drawn from the
draft's standardized law restricted to the paired tokens and renormalized, carried over to the target's ids,
and that law is the q reported with it; the draft's context then grows by the paired draft token. Any pairing
keeps the output exact, because each token is drawn from the q the engine is given (§2.3); the pairing decides
α, which is Σ_x min(p(x), q(x)) again, so a draft whose law matches the target's on shared tokens gets its full
α at every temperature, where the text mode gets only p(x). Tokens the intersection lacks are never proposed.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from .. import _core
from . import sampling
from .drafters import PythonDrafter
from ..models.model import as_model
from ..models.sequence_logits import sequence_logits

__all__ = ["CrossTokenizer", "MODES"]

MODES = ("text", "intersection")


def _encode(tokenizer, text: str) -> List[int]:
    """Token ids of `text` without special tokens, for a transformers tokenizer or a tokenizers.Tokenizer."""
    encoded = tokenizer.encode(text, add_special_tokens=False)
    return list(encoded.ids if hasattr(encoded, "ids") else encoded)


def _decode(tokenizer, ids: List[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def _checked_tokenizer(value, name: str):
    if not all(callable(getattr(value, m, None)) for m in ("encode", "decode")):
        raise ValueError(f"{name} must be a transformers tokenizer or a tokenizers.Tokenizer (an object with encode "
                         f"and decode), got {type(value).__name__}")
    return value


class CrossTokenizer(PythonDrafter):
    """Proposals of a draft model whose tokenizer differs from the target's (see the module's docstring).

    draft: anything ``speculant.load`` takes, or a loaded ``speculant.Model`` (decoder-only);
    draft_tokenizer / target_tokenizer: transformers tokenizers or tokenizers.Tokenizer objects;
    vocab_size: the target's. ``mode``: "text" (greedy drafting through text, the default) or "intersection"
    (sampling in the shared tokens at ``temperature``, ``top_k``, ``top_p``, from a generator seeded with ``seed``
    when built; the draft's logits are recomputed over the whole sequence for each proposed token).
    ``draft_tokens`` (text mode): draft tokens generated per iteration (default γ + 2: a draft token is often
    shorter than a target token).
    """

    kind = "cross_tokenizer"

    def __init__(self, draft, draft_tokenizer, target_tokenizer, vocab_size: int, device="cpu", *,
                 mode: str = "text", draft_tokens: Optional[int] = None, temperature: float = 1.0, top_k: int = 0,
                 top_p: float = 1.0, seed: int = 0):
        self.draft = as_model(draft, "draft")
        if self.draft.encoder_decoder:
            raise ValueError("draft: an encoder-decoder draft cannot continue the target's text; CrossTokenizer "
                             "needs a decoder-only draft")
        self.draft_tokenizer = _checked_tokenizer(draft_tokenizer, "draft_tokenizer")
        self.target_tokenizer = _checked_tokenizer(target_tokenizer, "target_tokenizer")
        if draft_tokens is not None and (isinstance(draft_tokens, bool) or not isinstance(draft_tokens, int)
                                         or draft_tokens < 1):
            raise ValueError(f"draft_tokens must be an integer >= 1 or None, got {draft_tokens!r}")
        self.draft_tokens = draft_tokens
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(map(repr, MODES))}, got {mode!r}")
        self.mode = mode
        self.settings = sampling.SamplingSettings(temperature, top_k, top_p).standardization()
        self._generator = torch.Generator().manual_seed(seed)
        self._paired = None  # (draft ids [m], target ids [m], the draft id of each paired target id), at first use
        self._draft_logits = None
        self._greedy = _core.GreedyContinuation(self.draft.engine)
        super().__init__(self._propose, vocab_size, device)

    def continuation(self, text: str, count: int) -> str:
        """The text the draft adds to `text` in `count` greedy tokens ("" when it cannot: no tokens, no room).
        The draft's cache is kept between calls (_core.GreedyContinuation): only the tokens after the longest
        prefix this call's draft tokens share with the last call's are run."""
        ids = _encode(self.draft_tokenizer, text)
        room = count if self.draft.max_length is None else min(count, self.draft.max_length - len(ids))
        if not ids or room < 1:
            return ""
        added = self._greedy(ids, room)
        before, after = _decode(self.draft_tokenizer, ids), _decode(self.draft_tokenizer, ids + list(added))
        return after[len(before):] if after.startswith(before) else _decode(self.draft_tokenizer, list(added))

    def proposal(self, context: List[int], gamma: int) -> List[int]:
        """Up to gamma target tokens continuing `context` (target token ids), the deterministic proposal."""
        text = _decode(self.target_tokenizer, context)
        more = self.continuation(text, self.draft_tokens or gamma + 2)
        if not more:
            return []
        whole = _encode(self.target_tokenizer, text + more)
        tokens = whole[len(context):] if whole[:len(context)] == list(context) else _encode(self.target_tokenizer,
                                                                                               more)
        kept = []
        for token in tokens[:gamma]:
            if not 0 <= token < self.vocab_size:  # a tokenizer larger than the target's vocabulary
                break
            kept.append(token)
        return kept

    def pairs(self):
        """(draft ids [m], target ids [m]): the tokens whose text is the same in both vocabularies (each decoded
        alone; empty texts and cut characters, U+FFFD, left out), the first draft id for each text."""
        if self._paired is None:
            by_text = {}
            for d in range(self.draft.vocab_size):
                text = _decode(self.draft_tokenizer, [d])
                if text and "\ufffd" not in text:
                    by_text.setdefault(text, d)
            pairs = [(by_text[text], t) for t in range(self.vocab_size)
                     if (text := _decode(self.target_tokenizer, [t])) in by_text]
            self._paired = (torch.tensor([d for d, _ in pairs], dtype=torch.long),
                            torch.tensor([t for _, t in pairs], dtype=torch.long), {t: d for d, t in pairs})
        return self._paired[0], self._paired[1]

    def _sampled(self, context: List[int], gamma: int):
        """Up to gamma target tokens drawn in the intersection, and the laws [k, V] they were drawn from."""
        draft_ids, target_ids = self.pairs()
        ids = _encode(self.draft_tokenizer, _decode(self.target_tokenizer, context))
        if not ids or not len(draft_ids):
            return [], None
        if self._draft_logits is None:
            self._draft_logits = sequence_logits(self.draft, "draft")
        limit = self.draft.max_length or len(ids) + gamma
        tokens, laws = [], []
        while len(tokens) < gamma and len(ids) < limit:
            law = sampling.standardize(self._draft_logits(ids)[-1:].float().cpu(), *self.settings)[0]  # [V_d]
            shared = law[draft_ids]  # [m]
            total = shared.sum()
            if total <= 0:  # the draft puts no mass on a shared token here
                break
            q = torch.zeros(self.vocab_size).index_add_(0, target_ids, shared / total)  # [V]
            token = int(torch.multinomial(q.double(), 1, generator=self._generator))
            tokens.append(token)
            laws.append(q)
            ids.append(self._paired[2][token])
        return tokens, (torch.stack(laws) if tokens else None)

    def _propose(self, context: List[int], gamma: int):
        if self.mode == "intersection":
            return self._sampled(context, gamma)
        tokens = self.proposal(context, gamma)
        if not tokens:
            return [], None
        return tokens, torch.nn.functional.one_hot(torch.tensor(tokens), self.vocab_size).float()  # point masses
