"""Drafters without a model (speculant.drafters), built the same way for several test modules.

`every_drafter` gives one of each chain drafter (unigram, bigram, prompt lookup, a Python drafter) over VOCAB
tokens; `table_drafters` gives the tree-capable ones (bigram, unigram, and `python_scorer`: a Python drafter with
score= whose law depends on the last two tokens) over a given vocabulary.
"""

import numpy as np
import torch

from speculant import drafters

VOCAB = 32


def every_drafter():
    corpus = np.random.default_rng(0).integers(0, VOCAB, 500)
    return {
        "unigram": drafters.Unigram.fit(corpus, VOCAB),
        "bigram": drafters.Bigram.fit(corpus, VOCAB),
        "prompt_lookup": drafters.PromptLookup(VOCAB, max_ngram=3),
        "python": drafters.PythonDrafter(lambda context, gamma: ([context[-1]] * gamma,
                                                                 torch.nn.functional.one_hot(
                                                                     torch.tensor([context[-1]] * gamma), VOCAB)
                                                                 .float()), VOCAB),
    }


def python_scorer(vocab: int, seed: int):
    """A PythonDrafter whose law after a context depends on its last two tokens (a fixed random table)."""
    from speculant import drafters
    laws = torch.softmax(2.0 * torch.randn(vocab + 1, vocab, vocab, generator=torch.Generator().manual_seed(seed)),
                         -1)

    def score(contexts):
        return torch.stack([laws[c[-2] if len(c) > 1 else vocab, c[-1]] for c in contexts])

    def propose(context, gamma):  # chains: never asked here
        raise AssertionError("a tree decoder asks score(), not propose()")

    return drafters.PythonDrafter(propose, vocab, score=score)


def table_drafters(vocab: int, seed: int):
    from speculant import drafters
    corpus = torch.randint(0, vocab, (400,), generator=torch.Generator().manual_seed(seed))
    return {"bigram": drafters.Bigram.fit(corpus, vocab), "unigram": drafters.Unigram.fit(corpus, vocab),
            "python": python_scorer(vocab, seed)}
