"""Drafters beside a neural draft model: negligible-cost proposals (c ≈ 0) that keep the output law exact.

* ``Unigram`` / ``Bigram``: token tables estimated from a corpus of token ids (the paper's Table 3 measures α
  for both). ``fit`` counts, ``save`` / ``load`` round-trip them (a torch file of tensors). The bigram is
  smoothed with Witten-Bell interpolation towards the unigram, q(b | a) = (c(a, b) + T(a) u(b)) / (c(a) + T(a))
  with T(a) the number of distinct tokens seen after a; the unigram is add-one smoothed, so q > 0 everywhere.
  Both are standardized with the decoder's temperature / top-k / top-p like any draft (§2.2).
* ``PromptLookup``: copies from the context (§3.6): the longest n-gram ending the sequence (max_ngram down to
  min_ngram tokens) that occurred earlier in it proposes the tokens that followed its latest occurrence; q is
  the point mass on each proposed token. Without a match it proposes nothing and the iteration runs the target
  alone.
* ``PythonDrafter``: your own idea, in Python: ``propose(context: list[int], gamma: int) -> (tokens, q)``
  returning k <= gamma token ids and the [k, V] distributions they were drawn from (a point mass is fine).
  The engine checks the shapes, that rows sum to 1 and that q(x_i) > 0, and raises ValueError otherwise.

Any of them goes where a draft model goes: ``SpeculativeDecoder(target, drafter, gamma=...)``. Exactness holds
for every drafter because the verification corrects for whatever q was (§2.3), provided each token was drawn
from the q reported with it, which is why a Python drafter must return both.
"""

from __future__ import annotations

import os
import zipfile
from typing import Callable, Iterable, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .. import _core
from ..models.model import archive_problem

__all__ = ["Unigram", "Bigram", "PromptLookup", "PythonDrafter", "Drafter"]

Corpus = Union[Sequence[int], np.ndarray, torch.Tensor, Iterable[Sequence[int]]]


def _device(device) -> str:
    return str(torch.device(device))


def _sequences(corpus: Corpus, vocab_size: int) -> list:
    """The corpus as a list of int64 numpy arrays (one flat sequence, or several documents)."""
    if isinstance(corpus, torch.Tensor):
        corpus = corpus.cpu().numpy()
    if isinstance(corpus, np.ndarray) and corpus.ndim == 1:
        sequences = [corpus.astype(np.int64)]
    else:
        corpus = list(corpus)
        if corpus and all(isinstance(x, (int, np.integer)) for x in corpus):
            sequences = [np.asarray(corpus, dtype=np.int64)]
        else:
            sequences = [np.asarray(list(doc), dtype=np.int64).reshape(-1) for doc in corpus]
    if not sequences or sum(len(s) for s in sequences) == 0:
        raise ValueError("corpus must hold at least one token id")
    for s in sequences:
        if len(s) and (s.min() < 0 or s.max() >= vocab_size):
            raise ValueError(f"corpus token ids must be in [0, vocab_size = {vocab_size}), got "
                             f"[{int(s.min())}, {int(s.max())}]")
    return sequences


def _vocab(vocab_size) -> int:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 1:
        raise ValueError(f"vocab_size must be an integer >= 1, got {vocab_size!r}")
    return int(vocab_size)


class Drafter:
    """A drafter handle: pass it as the draft of a SpeculativeDecoder."""

    kind = "drafter"

    def __init__(self, core: _core.Drafter):
        self._core = core

    @property
    def engine(self) -> _core.Drafter:
        """The engine's handle of this drafter (speculant._core.Drafter), which decoders are built on."""
        return self._core

    @property
    def vocab_size(self) -> int:
        return self._core.vocab_size

    @property
    def device(self) -> torch.device:
        return torch.device(self._core.device)

    @property
    def tree_obstacle(self) -> str:
        """Why this drafter cannot propose token trees (SpeculativeDecoder's tree=), or "" when it can."""
        return self._core.tree_obstacle

    def __repr__(self) -> str:
        return f"speculant.drafters.{type(self).__name__}(vocab_size={self.vocab_size}, device={str(self.device)!r})"


class Unigram(Drafter):
    """q = the corpus's token frequencies (add-one smoothed), the same for every position."""

    kind = "unigram"

    def __init__(self, probabilities: torch.Tensor, device="cpu"):
        probabilities = torch.as_tensor(probabilities, dtype=torch.float64)
        self.probabilities = probabilities
        super().__init__(_core.unigram_drafter(probabilities, _device(device)))

    @staticmethod
    def counts(sequences: list, vocab_size: int) -> np.ndarray:
        return sum(np.bincount(s, minlength=vocab_size) for s in sequences).astype(np.float64)

    @classmethod
    def fit(cls, corpus: Corpus, vocab_size: int, device="cpu") -> "Unigram":
        vocab_size = _vocab(vocab_size)
        counts = cls.counts(_sequences(corpus, vocab_size), vocab_size) + 1.0  # add-one
        return cls(torch.from_numpy(counts / counts.sum()), device)

    def save(self, path: Union[str, os.PathLike]) -> None:
        torch.save({"kind": self.kind, "unigram": self.probabilities}, os.fspath(path))

    @classmethod
    def load(cls, path: Union[str, os.PathLike], device="cpu") -> "Unigram":
        return _load(path, cls.kind, lambda data: cls(data["unigram"], device))


class Bigram(Drafter):
    """q(b | a): bigram counts of the corpus, Witten-Bell interpolated with the add-one unigram."""

    kind = "bigram"

    def __init__(self, unigram: torch.Tensor, row_ptr: torch.Tensor, followers: torch.Tensor,
                 counts: torch.Tensor, device="cpu"):
        self.unigram, self.row_ptr, self.followers, self.counts = (
            torch.as_tensor(unigram, dtype=torch.float64), torch.as_tensor(row_ptr, dtype=torch.int64),
            torch.as_tensor(followers, dtype=torch.int64), torch.as_tensor(counts, dtype=torch.float64))
        super().__init__(_core.bigram_drafter(self.unigram, self.row_ptr, self.followers, self.counts,
                                              _device(device)))

    @classmethod
    def fit(cls, corpus: Corpus, vocab_size: int, device="cpu") -> "Bigram":
        vocab_size = _vocab(vocab_size)
        sequences = _sequences(corpus, vocab_size)
        unigram = Unigram.counts(sequences, vocab_size) + 1.0
        pairs = np.concatenate([s[:-1] * vocab_size + s[1:] for s in sequences if len(s) > 1] or
                               [np.zeros(0, dtype=np.int64)])
        keys, counts = np.unique(pairs, return_counts=True)  # sorted by (a, b)
        previous, followers = keys // vocab_size, keys % vocab_size
        row_ptr = np.zeros(vocab_size + 1, dtype=np.int64)
        np.add.at(row_ptr, previous + 1, 1)
        return cls(torch.from_numpy(unigram / unigram.sum()), torch.from_numpy(np.cumsum(row_ptr)),
                   torch.from_numpy(followers), torch.from_numpy(counts.astype(np.float64)), device)

    def save(self, path: Union[str, os.PathLike]) -> None:
        torch.save({"kind": self.kind, "unigram": self.unigram, "row_ptr": self.row_ptr,
                    "followers": self.followers, "counts": self.counts}, os.fspath(path))

    @classmethod
    def load(cls, path: Union[str, os.PathLike], device="cpu") -> "Bigram":
        return _load(path, cls.kind, lambda data: cls(data["unigram"], data["row_ptr"], data["followers"],
                                                      data["counts"], device))


def _load(path, kind: str, build: Callable[[dict], Drafter]) -> Drafter:
    """The drafter `build` makes from the file's tensors (read with weights_only=True: no code runs); every
    failure is a ValueError naming the file and what is wrong with it."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"drafter file not found: {path}")
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{path} is not a speculant drafter file: not a torch.save archive (truncated, corrupted "
                         "or another format)")
    problem = archive_problem(path)
    if problem:
        raise ValueError(f"{path} is a damaged drafter file, truncated or corrupted ({problem})")
    try:
        data = torch.load(path, weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file gets the same explanation
        raise ValueError(f"{path} is not a speculant drafter file: {error}") from None
    if not isinstance(data, dict) or data.get("kind") != kind:
        found = data.get("kind") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{path} holds a {found!r} drafter, not a {kind!r} one")
    try:
        return build(data)
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"{path} is not a valid {kind} drafter file: {type(error).__name__}: {error}") from None


class PromptLookup(Drafter):
    """Copies the continuation of the longest recent n-gram match in the context (point-mass q)."""

    kind = "prompt_lookup"

    def __init__(self, vocab_size: int, *, min_ngram: int = 1, max_ngram: int = 3, device="cpu"):
        for name, value in (("min_ngram", min_ngram), ("max_ngram", max_ngram)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        self.min_ngram, self.max_ngram = min_ngram, max_ngram  # what rebuilds it elsewhere (a sweep's workers)
        super().__init__(_core.prompt_lookup_drafter(_vocab(vocab_size), min_ngram, max_ngram, _device(device)))


class PythonDrafter(Drafter):
    """A drafter written in Python: ``propose(context: list[int], gamma: int) -> (tokens, q)``.

    tokens: k <= gamma token ids; q: a float tensor [k, V] whose row i is the distribution tokens[i] was drawn
    from (return ``([], None)`` to propose nothing). The engine calls it with the GIL held, once per iteration.

    ``score(contexts: list[list[int]]) -> q [n, V]`` (optional) lets it propose token trees
    (``SpeculativeDecoder(tree=...)``): row i is the law after contexts[i] (the sequence so far, then a path of
    the tree), called once per depth for every node of that depth with children; the engine draws the children
    from it (by the decoder's ``siblings``; at temperature 0 its top k), so the law stays exact whatever it
    returns, as long as it returns a law.
    """

    kind = "python"

    def __init__(self, propose: Callable[[list, int], Tuple[Sequence[int], Optional[torch.Tensor]]],
                 vocab_size: int, device="cpu", *, score: Optional[Callable[[list], torch.Tensor]] = None):
        if not callable(propose):
            raise ValueError(f"propose must be callable, got {type(propose).__name__}")
        if score is not None and not callable(score):
            raise ValueError(f"score must be callable or None, got {type(score).__name__}")
        self.propose = propose
        self.score = score
        super().__init__(_core.python_drafter(propose, _vocab(vocab_size), _device(device), score))
