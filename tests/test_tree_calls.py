"""The tree calls of the batched cached form (cpp/models/model.h; export/cached.py writes them): extend_rows_masked and
copy_slots, on TinyGPT's cached form and on GPT-2 and Llama exports.

* Every node of a tree of drafts, fed in one masked call (ancestor mask, positions by depth, slots by node),
  has the logits a stateless forward gives for its path: the cached prefix, then root to node.
* After copy_slots moves an accepted path into consecutive slots, a plain extend_rows continues as if the path
  had been fed as a chain: the moved cache entries are the chain's.
* Two rows with trees of different sizes in one call (the smaller padded: scratch slot, slot 0 visible) give
  each row its own answer.
* Malformed calls are refused by name.
"""

import pytest
import torch

from support import hf_models
import speculant
from support.decoding_references import TARGET
from speculant.tiny_gpt import script_cached

# Breadth-first parents of two trees: node 0 is the root (the last decided token, fed with its drafts)
TREES = [[-1, 0, 0, 1, 1, 2, 3, 3], [-1, 0, 1, 1]]
PATHS = [[0, 2, 5], [0, 1, 3]]  # one accepted path per tree, root first
PREFIXES = [9, 4]  # cached tokens per row before the tree
ATOL = 2e-4


@pytest.fixture(scope="module", params=["tiny", "gpt2", "llama"])
def module(request, tmp_path_factory):
    if request.param == "tiny":
        return script_cached(TARGET)
    path = tmp_path_factory.mktemp(request.param) / "model.pt"
    speculant.export(hf_models.make(request.param, seed=0), path, max_length=64)
    return torch.jit.load(str(path))


def depths(parents):
    out = [0]
    for p in parents[1:]:
        out.append(out[p] + 1)
    return out


def ancestors(parents, node):
    chain = []
    while node >= 0:
        chain.append(node)
        node = parents[node]
    return chain[::-1]  # root first


def last_logits(module, tokens):
    """A stateless forward's next-token logits after `tokens`."""
    return module.forward(torch.tensor([tokens]))[0, -1]


def prefill(module, rows, prefixes):
    module.start_rows(len(rows))
    for r, tokens in enumerate(rows):
        n = len(tokens)
        positions = torch.arange(n).unsqueeze(0)
        module.extend_rows(torch.tensor([tokens]), torch.tensor([r]), positions, positions, n)


def tree_call(module, rows, trees, tokens):
    """One extend_rows_masked call over every row's tree; returns the logits [R, W, V]."""
    width = max(len(t) for t in trees)
    keys = max(len(rows[r]) + len(trees[r]) for r in range(len(rows)))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    positions = torch.zeros(len(rows), width, dtype=torch.long)
    slots = torch.full((len(rows), width), module.max_length, dtype=torch.long)  # padding: the scratch slot
    mask = torch.zeros(len(rows), width, keys, dtype=torch.bool)
    mask[:, :, 0] = True
    for r, parents in enumerate(trees):
        length, depth = len(rows[r]), depths(parents)
        for node in range(len(parents)):
            ids[r, node] = tokens[r][node]
            positions[r, node] = length + depth[node]
            slots[r, node] = length + node
            mask[r, node, :length] = True
            for up in ancestors(parents, node):
                mask[r, node, length + up] = True
    return module.extend_rows_masked(ids, torch.arange(len(rows)), positions, slots, mask)


def test_tree_nodes_see_their_paths_and_copy_slots_makes_a_chain(module):
    g = torch.Generator().manual_seed(0)
    vocab = module.vocab_size
    rows = [torch.randint(0, vocab, (n,), generator=g).tolist() for n in PREFIXES]
    tokens = [torch.randint(0, vocab, (len(t),), generator=g).tolist() for t in TREES]
    prefill(module, rows, PREFIXES)
    logits = tree_call(module, rows, TREES, tokens)
    assert logits.shape == (len(rows), max(map(len, TREES)), vocab)
    for r, parents in enumerate(TREES):
        for node in range(len(parents)):
            path = [tokens[r][v] for v in ancestors(parents, node)]
            torch.testing.assert_close(logits[r, node], last_logits(module, rows[r] + path), atol=ATOL, rtol=0,
                                       msg=f"row {r} node {node}")

    # keep PATHS[r]: move node path[i] from slot length + path[i] to slot length + i
    m = max(len(p) for p in PATHS)
    sources = torch.tensor([[len(rows[r]) + v for v in p] + [len(rows[r])] * (m - len(p)) for r, p in enumerate(PATHS)])
    targets = torch.tensor([[len(rows[r]) + i for i in range(len(p))] + [len(rows[r])] * (m - len(p))
                            for r, p in enumerate(PATHS)])
    module.copy_slots(torch.arange(len(rows)), sources, targets)
    for r, path in enumerate(PATHS):
        kept = rows[r] + [tokens[r][v] for v in path]
        nxt = int(torch.randint(0, vocab, (1,), generator=g))
        at = torch.tensor([[len(kept)]])
        out = module.extend_rows(torch.tensor([[nxt]]), torch.tensor([r]), at, at, len(kept) + 1)
        torch.testing.assert_close(out[0, 0], last_logits(module, kept + [nxt]), atol=ATOL, rtol=0,
                                   msg=f"row {r} after copy_slots")


def test_chain_mask_is_extend_rows(module):
    vocab = module.vocab_size
    tokens = torch.arange(12) % vocab
    prefill(module, [tokens[:5].tolist()], [5])
    chain = [-1, 0, 1, 2]
    masked = tree_call(module, [tokens[:5].tolist()], [chain], [tokens[5:9].tolist()])
    prefill(module, [tokens[:5].tolist()], [5])
    positions = torch.arange(5, 9).unsqueeze(0)
    plain = module.extend_rows(tokens[5:9].unsqueeze(0), torch.tensor([0]), positions, positions, 9)
    torch.testing.assert_close(masked, plain, atol=ATOL, rtol=0)


def test_malformed_tree_calls_are_refused(module):
    module.start_rows(1)
    ids = torch.zeros(1, 2, dtype=torch.long)
    rows, positions = torch.tensor([0]), torch.tensor([[0, 1]])
    with pytest.raises(torch.jit.Error, match="mask must be bool"):
        module.extend_rows_masked(ids, rows, positions, positions, torch.ones(1, 2, 2, dtype=torch.long))
    with pytest.raises(torch.jit.Error, match=r"mask \[R, T, S\]"):
        module.extend_rows_masked(ids, rows, positions, positions, torch.ones(1, 3, 2, dtype=torch.bool))
    with pytest.raises(torch.jit.Error, match="sources, targets"):
        module.copy_slots(rows, torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long))
