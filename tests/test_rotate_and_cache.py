"""torch.ops.speculant.rotate_and_cache (cpp/kernels/rotate_and_cache.cpp): a Llama layer's rotary embedding of
its queries and keys and the write of its keys and values into the cache, in one operation.

On the CPU it is the composite the plain export runs (llama.py's rotate over head_tables, cached.py's cached_kv),
bit for bit, for the batch-1 cache and a batch's rows. The CUDA kernel is checked on a GPU against float64
references computed on the CPU (marked cuda: skipped without one): every dtype, grouped key/value heads, 1 to 16
tokens, one table for all rows or one per row, and the cache slots it must leave alone. The same kernel also runs
here, emulated on CPU threads under AddressSanitizer (tests/support/emulated_kernels.py), against the same references.
"""
import functools
import warnings

import pytest
import torch

from support import emulated_kernels
from support import kernel_checks
from support.kernel_checks import relative_error
from speculant.export import cached
from speculant.export.llama import head_tables, rotate

OPS = torch.ops.speculant


def inputs(batch, tokens, heads, kv_heads, dim, dtype, device="cpu", tables=1, seed=0):
    """qkv [B, T, (H + 2 H_kv) D]; cos, sin [tables, 1, T, D] (sin's first half negated, as llama.py stores it)."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(batch, tokens, (heads + 2 * kv_heads) * dim, generator=g)
    angles = torch.rand(tables, 1, tokens, dim // 2, generator=g) * 6.28
    cos = torch.cat((angles.cos(), angles.cos()), -1)
    sin = torch.cat((-angles.sin(), angles.sin()), -1)
    return tuple(t.to(dtype).to(device) for t in (qkv, cos, sin))


def batch_step(rows, slots, keys, dtype, device="cpu"):
    rows, slots = torch.tensor(rows, device=device), torch.tensor(slots, device=device)
    mask = torch.zeros(len(rows), 1, slots.size(1), keys, dtype=dtype, device=device)
    return cached.Step(slots, mask, 0, rows, slots, keys)


@functools.lru_cache(maxsize=None)
def scripted_cached_kv():
    """cached.cached_kv as the exports run it (TorchScript: index_put_ takes None for a whole dimension there)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's deprecation
        return torch.jit.script(cached.cached_kv)


def plain(qkv, cos, sin, cache, step, heads, kv_heads):
    """llama.py's Attention without the fused operations: every head rotated (the values by the identity), then
    cached_kv; the queries [B, H, T, D]."""
    B, T, width = qkv.shape
    D = width // (heads + 2 * kv_heads)
    cos, sin = head_tables(cos, sin, heads + kv_heads, kv_heads)
    rotated = rotate(qkv.view(B, T, heads + 2 * kv_heads, D).transpose(1, 2), cos, sin)
    scripted_cached_kv()(rotated[:, heads:].view(B, 2, kv_heads, T, D).transpose(0, 1), cache, step)
    return rotated[:, :heads]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (2, 2), (8, 1)])
def test_batch_one_on_the_cpu_is_the_plain_composite(dtype, heads, kv_heads):
    qkv, cos, sin = inputs(1, 3, heads, kv_heads, 8, dtype)
    before = torch.randn(2, kv_heads, 10, 8).to(dtype)
    want_cache, got_cache = before.clone(), before.clone()
    step = cached.single_step(3, 4, torch.device("cpu"), dtype)
    want = plain(qkv, cos, sin, want_cache, step, heads, kv_heads)
    got = OPS.rotate_and_cache(qkv, cos, sin, got_cache, None, None, 4, heads, kv_heads)
    assert torch.equal(got, want) and torch.equal(got_cache, want_cache)
    assert torch.equal(got_cache[:, :, :4], before[:, :, :4]) and torch.equal(got_cache[:, :, 7:], before[:, :, 7:])
    assert not torch.equal(got_cache[:, :, 4:7], before[:, :, 4:7])


@pytest.mark.parametrize("tables", [1, 3])
def test_batch_rows_on_the_cpu_are_the_plain_composite(tables):
    """Rows out of order and slots with gaps, as the engine's batches write them."""
    qkv, cos, sin = inputs(3, 2, 4, 2, 8, torch.float32, tables=tables)
    want_cache = torch.randn(2, 4, 9, 2, 8)
    got_cache = want_cache.clone()
    step = batch_step([2, 0, 3], [[5, 6], [1, 3], [7, 8]], 9, torch.float32)
    want = plain(qkv, cos, sin, want_cache, step, 4, 2)
    assert torch.equal(OPS.rotate_and_cache(qkv, cos, sin, got_cache, step.rows, step.slots, 0, 4, 2), want)
    assert torch.equal(got_cache, want_cache)


def test_bad_inputs_are_refused_naming_what_is_wrong():
    qkv, cos, sin = inputs(1, 3, 4, 2, 8, torch.float32)
    cache = torch.zeros(2, 2, 10, 8)
    with pytest.raises(ValueError, match="qkv must be"):
        OPS.rotate_and_cache(qkv, cos, sin, cache, None, None, 0, 3, 2)
    with pytest.raises(ValueError, match="cos and sin must both be"):
        OPS.rotate_and_cache(qkv, cos[..., :4], sin, cache, None, None, 0, 4, 2)
    rows_qkv, rows_cos, rows_sin = inputs(2, 3, 4, 2, 8, torch.float32, tables=2)
    with pytest.raises(ValueError, match="cos and sin must both be"):  # one table for all rows, the other per row
        OPS.rotate_and_cache(rows_qkv, rows_cos[:1], rows_sin, torch.zeros(2, 2, 10, 2, 8), torch.tensor([0, 1]),
                             torch.tensor([[0, 1, 2], [0, 1, 2]]), 0, 4, 2)
    with pytest.raises(ValueError, match="start \\+ T <= M"):
        OPS.rotate_and_cache(qkv, cos, sin, cache, None, None, 8, 4, 2)
    with pytest.raises(ValueError, match="share qkv's dtype"):
        OPS.rotate_and_cache(qkv, cos, sin, cache.double(), None, None, 0, 4, 2)
    with pytest.raises(ValueError, match="rows and slots come together"):
        OPS.rotate_and_cache(qkv, cos, sin, cache, torch.tensor([0]), None, 0, 4, 2)
    with pytest.raises(ValueError, match="rows take a cache"):
        OPS.rotate_and_cache(qkv, cos, sin, cache, torch.tensor([0]), torch.tensor([[0, 1, 2]]), 0, 4, 2)


TOLERANCES = {**kernel_checks.TOLERANCES, torch.float32: 1e-6}  # one rounding per element: tighter in float32


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads, kv_heads, dim", [(32, 8, 128), (32, 4, 64), (4, 4, 64), (2, 1, 256)])
@pytest.mark.parametrize("tokens", [1, 5, 16])
def test_cuda_batch_one_matches_a_float64_reference(dtype, heads, kv_heads, dim, tokens):
    qkv, cos, sin = inputs(1, tokens, heads, kv_heads, dim, dtype, "cuda", seed=dim + tokens)
    cache = torch.full((2, kv_heads, 40, dim), float("nan"), dtype=dtype, device="cuda")
    reference = torch.zeros(2, kv_heads, 40, dim, dtype=torch.float64)
    step = cached.single_step(tokens, 7, torch.device("cpu"), torch.float64)
    want = plain(*(t.double().cpu() for t in (qkv, cos, sin)), reference, step, heads, kv_heads)
    got = OPS.rotate_and_cache(qkv, cos, sin, cache, None, None, 7, heads, kv_heads)
    assert got.shape == (1, heads, tokens, dim) and relative_error(got, want) < TOLERANCES[dtype]
    written = cache[:, :, 7:7 + tokens]
    assert relative_error(written, reference[:, :, 7:7 + tokens]) < TOLERANCES[dtype]
    assert cache[:, :, :7].isnan().all() and cache[:, :, 7 + tokens:].isnan().all()  # no other slot written


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tables", [1, 3])
def test_cuda_batch_rows_match_a_float64_reference(dtype, tables):
    qkv, cos, sin = inputs(3, 4, 8, 2, 64, dtype, "cuda", tables=tables)
    cache = torch.full((2, 5, 12, 2, 64), float("nan"), dtype=dtype, device="cuda")
    reference = torch.full((2, 5, 12, 2, 64), float("nan"), dtype=torch.float64)
    rows, slots = [4, 0, 2], [[0, 1, 2, 3], [5, 7, 8, 11], [2, 3, 9, 10]]
    want = plain(*(t.double().cpu() for t in (qkv, cos, sin)), reference,
                 batch_step(rows, slots, 12, torch.float64), 8, 2)
    step = batch_step(rows, slots, 12, dtype, "cuda")
    got = OPS.rotate_and_cache(qkv, cos, sin, cache, step.rows, step.slots, 0, 8, 2)
    assert relative_error(got, want) < TOLERANCES[dtype]
    written = ~reference.isnan()
    assert torch.equal(~cache.isnan().cpu(), written)  # exactly the tokens' slots written
    assert relative_error(cache.cpu()[written], reference[written]) < TOLERANCES[dtype]


@pytest.mark.cuda
def test_cuda_rotate_and_cache_is_captured_and_replayed_in_a_graph():
    qkv, cos, sin = inputs(1, 1, 8, 2, 128, torch.bfloat16, "cuda")
    cache = torch.zeros(2, 2, 16, 128, dtype=torch.bfloat16, device="cuda")
    q = torch.empty(1, 8, 1, 128, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture
        OPS.rotate_and_cache(qkv, cos, sin, cache, None, None, 3, 8, 2)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q.copy_(OPS.rotate_and_cache(qkv, cos, sin, cache, None, None, 3, 8, 2))
    for _ in range(2):  # each replay reads the projection of the moment
        qkv.normal_()
        cache.zero_()
        graph.replay()
        torch.cuda.synchronize()
        reference = torch.zeros(2, 2, 16, 128, dtype=torch.float64)
        want = plain(*(t.double().cpu() for t in (qkv, cos, sin)), reference,
                     cached.single_step(1, 3, torch.device("cpu"), torch.float64), 8, 2)
        assert relative_error(q, want) < 1e-2 and relative_error(cache, reference) < 1e-2


def emulated(qkv, cos, sin, cache, rows, slots, start, heads, kv_heads):
    """rotate_and_cache.cu's launcher as rotate_and_cache.cpp calls it: (q, cache) after the launch."""
    B, T, width = qkv.shape
    D = width // (heads + 2 * kv_heads)
    batched = rows is not None
    stride = cache.stride()
    out = emulated_kernels.launch(
        "rotate_and_cache", qkv=qkv, cos=cos, sin=sin, q=torch.full((B, heads, T, D), float("nan"), dtype=qkv.dtype),
        cache=cache, rows=rows, slots=slots, cos_row_stride=0 if cos.size(0) == 1 else cos.stride(0),
        cache_stride=(stride[0], stride[1] if batched else 0, stride[2], stride[3] if batched else stride[1]),
        cache_rows=cache.size(1) if batched else 1, cache_slots=cache.size(2), batch=B, tokens=T, heads=heads,
        kv_heads=kv_heads, head_dim=D, start=start, dtype=qkv.dtype)
    return out["q"], out["cache"]


@emulated_kernels.needed
@pytest.mark.parametrize("dtype, heads, kv_heads, dim, tokens", [
    (torch.float32, 32, 8, 128, 1), (torch.bfloat16, 4, 4, 64, 5), (torch.float16, 2, 1, 256, 3)])
def test_emulated_batch_one_matches_a_float64_reference(dtype, heads, kv_heads, dim, tokens):
    qkv, cos, sin = inputs(1, tokens, heads, kv_heads, dim, dtype, seed=dim + tokens)
    cache = torch.full((2, kv_heads, 12, dim), float("nan"), dtype=dtype)
    reference = torch.zeros(2, kv_heads, 12, dim, dtype=torch.float64)
    want = plain(*(t.double() for t in (qkv, cos, sin)), reference,
                 cached.single_step(tokens, 7, torch.device("cpu"), torch.float64), heads, kv_heads)
    got, cache = emulated(qkv, cos, sin, cache, None, None, 7, heads, kv_heads)
    assert relative_error(got, want) < TOLERANCES[dtype]
    assert relative_error(cache[:, :, 7:7 + tokens], reference[:, :, 7:7 + tokens]) < TOLERANCES[dtype]
    assert cache[:, :, :7].isnan().all() and cache[:, :, 7 + tokens:].isnan().all()  # no other slot written


@emulated_kernels.needed
@pytest.mark.parametrize("tables", [1, 3])
def test_emulated_batch_rows_match_a_float64_reference(tables):
    qkv, cos, sin = inputs(3, 4, 8, 2, 64, torch.bfloat16, tables=tables)
    cache = torch.full((2, 5, 12, 2, 64), float("nan"), dtype=torch.bfloat16)
    reference = torch.full((2, 5, 12, 2, 64), float("nan"), dtype=torch.float64)
    rows, slots = [4, 0, 2], [[0, 1, 2, 3], [5, 7, 8, 11], [2, 3, 9, 10]]
    want = plain(*(t.double() for t in (qkv, cos, sin)), reference, batch_step(rows, slots, 12, torch.float64), 8, 2)
    got, cache = emulated(qkv, cos, sin, cache, torch.tensor(rows), torch.tensor(slots), 0, 8, 2)
    assert relative_error(got, want) < TOLERANCES[torch.bfloat16]
    written = ~reference.isnan()
    assert torch.equal(~cache.isnan(), written)  # exactly the tokens' slots written
    assert relative_error(cache[written], reference[written]) < TOLERANCES[torch.bfloat16]


@emulated_kernels.needed
@pytest.mark.parametrize("rows, slots", [([0, 5], [[0, 1], [2, 3]]), ([0, 1], [[0, 12], [2, 3]]),
                                         ([0, 1], [[0, -1], [2, 3]])])
def test_emulated_slots_outside_the_cache_trap(rows, slots):
    """A row or slot outside the cache stops the kernel (a trap) instead of writing out of it."""
    qkv, cos, sin = inputs(2, 2, 4, 2, 64, torch.float32)
    with pytest.raises(emulated_kernels.KernelFailed, match="__trap") as failed:
        emulated(qkv, cos, sin, torch.zeros(2, 5, 12, 2, 64), torch.tensor(rows), torch.tensor(slots), 0, 4, 2)
    assert failed.value.status == 3
