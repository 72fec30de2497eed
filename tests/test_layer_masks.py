"""speculant/models/layer_masks.py: each layer type's pattern in a tree mask, against transformers' own definitions.

* The boolean masks equal masking_utils' overlays (sliding_window_overlay, chunked_overlay) on top of the given
  ancestor mask, evaluated at every (query, key) pair of a tree whose nodes share positions, for several sizes.
* One type gives one [1, 1, k, S] tensor; several give the mapping by layer type; eager attention the additive
  form; keys are read only where a type reads positions.
* attention_layers reads layer_types, or Mistral's sliding_window alone; obstacle names unknown and unsized types.
* shrunk puts the config back even when the check raises; follows finds a window the model does not apply.
"""

import pytest
import torch
import transformers
from transformers import masking_utils

from support import hf_families
from speculant import layer_masks

# a tree after a prefix of 6 entries: root at 6, children at 7, grandchildren at 8 (entries in breadth-first order)
PARENTS = [-1, 0, 0, 1, 2, 2]
PREFIX = 6


def tree():
    """(ancestor mask [k, S], key positions [S], query positions [k])."""
    depth = []
    for parent in PARENTS:
        depth.append(0 if parent < 0 else depth[parent] + 1)
    k = len(PARENTS)
    mask = torch.zeros(k, PREFIX + k, dtype=torch.bool)
    mask[:, :PREFIX] = True
    for node in range(k):
        at = node
        while at >= 0:
            mask[node, PREFIX + at] = True
            at = PARENTS[at]
    queries = PREFIX + torch.tensor(depth)
    return mask, torch.cat([torch.arange(PREFIX), queries]), queries


def overlay_mask(overlay, mask, keys, queries):
    return torch.tensor([[bool(mask[q, s]) and bool(overlay(0, 0, queries[q], keys[s]))
                          for s in range(keys.numel())] for q in range(queries.numel())])


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_patterns_equal_transformers_overlays(size):
    mask, keys, queries = tree()
    cases = {"sliding_attention": masking_utils.sliding_window_overlay(size),
             "chunked_attention": masking_utils.chunked_overlay(size, torch.zeros(1, dtype=torch.long))}
    for kind, overlay in cases.items():
        got = layer_masks.attention_mask(mask, keys, queries, {kind: size}, "sdpa", torch.float32)
        assert got.shape == (1, 1, len(PARENTS), keys.numel()) and got.dtype == torch.bool
        assert torch.equal(got[0, 0], overlay_mask(overlay, mask, keys, queries)), kind
        assert not torch.equal(got[0, 0], mask) or size > PREFIX  # the pattern bites in this tree


def test_several_types_eager_and_full():
    mask, keys, queries = tree()
    layers = {"sliding_attention": 3, "full_attention": None, "chunked_attention": 4}
    masks = layer_masks.attention_mask(mask, keys, queries, layers, "sdpa", torch.float32)
    assert set(masks) == set(layers) and torch.equal(masks["full_attention"][0, 0], mask)
    eager = layer_masks.attention_mask(mask, keys, queries, layers, "eager", torch.bfloat16)
    for kind in layers:
        additive = eager[kind][0, 0]
        assert additive.dtype == torch.bfloat16
        assert torch.equal(additive == 0, masks[kind][0, 0])
        assert torch.all(additive[~masks[kind][0, 0]] == torch.finfo(torch.bfloat16).min)
    full = layer_masks.attention_mask(mask, None, queries, {"full_attention": None}, "sdpa", torch.float32)
    assert torch.equal(full[0, 0], mask)  # no positions read without a pattern


def test_attention_layers_and_obstacles():
    mistral = transformers.MistralConfig(sliding_window=16)
    assert layer_masks.attention_layers(mistral) == {"sliding_attention": 16}
    assert layer_masks.attention_layers(transformers.MistralConfig(sliding_window=None)) == {"full_attention": None}
    qwen2 = transformers.Qwen2Config(sliding_window=64, use_sliding_window=False, num_hidden_layers=2)
    assert layer_masks.attention_layers(qwen2) == {"full_attention": None}  # its layer_types: full only
    gemma = hf_families.make("gemma3", seed=0).config
    assert layer_masks.attention_layers(gemma) == {"sliding_attention": hf_families.WINDOW, "full_attention": None}
    assert layer_masks.positional(layer_masks.attention_layers(gemma))
    assert layer_masks.obstacle({"full_attention": None, "sliding_attention": 4}) == ""
    assert "'linear_attention' have no tree mask" in layer_masks.obstacle({"linear_attention": None})
    assert "sliding_attention layers but no sliding_window" in layer_masks.obstacle({"sliding_attention": None})


def test_shrunk_restores_the_config_and_follows_finds_a_stray_window():
    model = hf_families.make("mistral", seed=0)
    layers = layer_masks.attention_layers(model.config)
    assert layer_masks.follows(model, layers) == ""
    with pytest.raises(RuntimeError, match="inside"):
        with layer_masks.shrunk(model.config, layers) as (small, fields):
            assert model.config.sliding_window == layer_masks.SMALL and small == {"sliding_attention": 2}
            assert fields == ["sliding_window"]
            raise RuntimeError("inside")
    assert model.config.sliding_window == hf_families.WINDOW
    stray = hf_families.make("llama", seed=0)  # Llama's masks read no sliding_window
    stray.config.sliding_window = 8
    why = layer_masks.follows(stray, layer_masks.attention_layers(stray.config))
    assert "does not apply sliding_window as transformers' masks do" in why
    assert stray.config.sliding_window == 8
