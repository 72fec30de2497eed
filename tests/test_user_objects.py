"""speculant leaves the user's objects as it found them: a live transformers model loaded by speculant.load, or
under an EarlyExitDraft (sharing the target's cache, or with one of its own), an EagleDraft (EAGLE-1/2 and EAGLE-3's
layer features) or a MedusaDraft, can still be deep-copied, pickled and written by torch.save, after the draft is
built and after a generation with it; the pickle holds nothing of speculant's (no hook, no handle), and the deep
copy gives the original's logits. (Before, a hook on the user's modules held speculant's state, and a shared-cache
early-exit draft's made copy.deepcopy fail with "cannot pickle 'mappingproxy' object".)
"""

import copy
import io
import pickle

import pytest
import torch

from support import hf_models
import speculant

PROMPT = [1, 5, 9, 4]


def build(kind: str, target: speculant.Model):
    """The draft of `kind` on `target` (None: the target decodes alone)."""
    if kind == "load":
        return None
    if kind == "early_exit":
        return speculant.EarlyExitDraft(target, exit_layer=1)
    if kind == "early_exit_own_cache":
        return speculant.EarlyExitDraft(target, exit_layer=1, share_cache=False)
    if kind == "eagle":
        return speculant.EagleDraft(target, seed=1)
    if kind == "eagle3":
        return speculant.EagleDraft(target, feature_layers=(0, 1), seed=2)
    return speculant.MedusaDraft(target, heads=2)


def assert_left_as_found(model, before: bytes, when: str) -> None:
    """deepcopy, pickle and torch.save of `model` work, write what they wrote before speculant touched it, and the
    copy computes the same logits."""
    copied = copy.deepcopy(model)
    pickled = pickle.dumps(model)
    assert b"speculant" not in pickled, f"{when}: the pickled model holds speculant's objects"
    assert pickled == before, f"{when}: the pickled model differs from the model as it was given"
    buffer = io.BytesIO()
    torch.save(model, buffer)
    assert buffer.getvalue(), when
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        torch.testing.assert_close(copied(ids).logits, model(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("kind", ["load", "early_exit", "early_exit_own_cache", "eagle", "eagle3", "medusa"])
def test_the_model_can_be_copied_pickled_and_saved_after_every_call(kind, arch):
    model = hf_models.make(arch, seed=10)
    with torch.no_grad():
        model(torch.tensor([PROMPT]))  # what a first forward sets lazily, it sets before the reference pickle
    before = pickle.dumps(model)
    target = speculant.load(model)
    draft = build(kind, target)
    assert_left_as_found(model, before, f"{kind}: built")
    if draft is None:
        results = [speculant.generate(target, [PROMPT, PROMPT[:2]], max_new_tokens=6, seed=0)[0]]
    else:  # chains (a batch of two rows: replicas of the target) and a token tree
        results = [speculant.SpeculativeDecoder(target, draft, gamma=2, temperature=1.0).generate(
            [PROMPT, PROMPT[:2]], max_new_tokens=6, seed=0)[0],
            speculant.SpeculativeDecoder(target, draft, tree=[2, 1], temperature=1.0).generate(
                PROMPT, max_new_tokens=6, seed=1)]
    assert all(len(result.tokens) == 6 for result in results)
    assert_left_as_found(model, before, f"{kind}: after generate")
