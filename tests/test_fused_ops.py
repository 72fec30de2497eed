"""torch.ops.speculant.rms_norm and decode_attention (cpp/kernels/ops.cpp), and the exports that use them
(kernels="speculant").

On the CPU each operation is the ATen composite it replaces, so a fused export must compute bit for bit what
the plain one does, through every path of the engine (prefill, extend, truncate, verification widths, a batch's
rows). The CUDA kernels are checked on a GPU against float64 references computed on the CPU (marked cuda:
skipped without one): random inputs, the cache's strided views, masked keys, every dtype and head size, the
output poisoned first. The same kernels also run here, emulated on CPU threads under AddressSanitizer and
ThreadSanitizer (tests/support/emulated_kernels.py), against the same references.
"""
import pytest
import torch
import torch.nn.functional as F

from support import emulated_kernels
from support import hf_models
import speculant
from support.kernel_checks import TOLERANCES, relative_error

OPS = torch.ops.speculant


def stacked_attention(q, k, v, mask, scale):
    """The exports' attention without the fused operation: mask [T, S] or [B, 1, T, S] repeated for the N / T
    query heads stacked along q's rows (llama.py's Llama.run)."""
    rows = mask.unsqueeze(0) if mask.dim() == 2 else mask.squeeze(1)  # [Bm, T, S]
    Bm, T, S = rows.shape
    stacked = rows.unsqueeze(1).expand(Bm, q.size(2) // T, T, S).reshape(Bm, 1, q.size(2), S)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=stacked, scale=scale)


def additive_mask(seen: torch.Tensor, dtype) -> torch.Tensor:
    return torch.where(seen, 0.0, float("-inf")).to(dtype)


def attention_inputs(batch, heads, group, new, keys, dim, dtype, device="cpu", seed=0, mask_batch=1):
    """q [B, H, group * new, D]; k, v strided views of a [2, B, keys + 3, H, D] cache as the batch path reads
    it; a causal-with-gaps additive mask [new, keys] or [B, 1, new, keys]."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, group * new, dim, generator=g).to(dtype).to(device)
    cache = torch.randn(2, batch, keys + 3, heads, dim, generator=g).to(dtype).to(device)
    k, v = cache[0, :, :keys].transpose(1, 2), cache[1, :, :keys].transpose(1, 2)  # [B, H, S, D], strided
    seen = torch.rand(mask_batch, new, keys, generator=g) < 0.7
    seen[..., 0] = True  # every query sees at least one key, as every query sees itself in the engine
    mask = additive_mask(seen, dtype).to(device)
    return q, k, v, (mask[0] if mask_batch == 1 else mask.unsqueeze(1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_on_the_cpu_is_torch_rms_norm(dtype):
    x = torch.randn(3, 5, 40).to(dtype)
    weight = torch.randn(40).to(dtype)
    assert torch.equal(OPS.rms_norm(x, weight, 1e-5), torch.rms_norm(x, [40], weight, 1e-5))


@pytest.mark.parametrize("batch, heads, group, new, mask_batch", [(1, 2, 1, 1, 1), (1, 2, 4, 3, 1),
                                                                   (3, 1, 2, 5, 3), (2, 3, 1, 4, 1)])
def test_decode_attention_on_the_cpu_is_the_stacked_composite(batch, heads, group, new, mask_batch):
    q, k, v, mask = attention_inputs(batch, heads, group, new, 9, 16, torch.float32, mask_batch=mask_batch)
    assert torch.equal(OPS.decode_attention(q, k, v, mask, 0.25), stacked_attention(q, k, v, mask, 0.25))


def test_bad_inputs_are_refused_naming_what_is_wrong():
    q, k, v, mask = attention_inputs(1, 2, 2, 3, 9, 16, torch.float32)
    with pytest.raises(ValueError, match="mask .* does not fit q"):
        OPS.decode_attention(q, k, v, torch.zeros(4, 9), 1.0)  # 4 mask rows do not divide 6 query rows
    with pytest.raises(ValueError, match="k and v must be"):
        OPS.decode_attention(q, k[:, :, :4], v, mask, 1.0)
    with pytest.raises(ValueError, match="share a dtype"):
        OPS.decode_attention(q, k, v, mask.double(), 1.0)
    with pytest.raises(ValueError, match="weight must be"):
        OPS.rms_norm(torch.ones(2, 8), torch.ones(7), 1e-5)
    with pytest.raises(ValueError, match="share a dtype and device"):
        OPS.rms_norm(torch.ones(2, 8), torch.ones(8, dtype=torch.float64), 1e-5)


def export_pair(arch, tmp_path, **overrides):
    model = hf_models.make(arch, seed=3, **overrides)
    paths = {}
    for kernels in ("aten", "speculant"):
        paths[kernels] = tmp_path / f"{arch}-{kernels}.pt"
        speculant.export(model, paths[kernels], kernels=kernels)
    return paths


@pytest.mark.parametrize("arch, overrides", [("llama", {}), ("llama", {"num_key_value_heads": 1}),
                                             ("gpt2", {})])
def test_fused_exports_compute_what_plain_ones_do_on_the_cpu(arch, overrides, tmp_path):
    paths = export_pair(arch, tmp_path, **overrides)
    fused, plain = (torch.jit.load(str(paths[k])) for k in ("speculant", "aten"))
    graph = str(fused.inlined_graph)  # forward, with the layers' code inlined
    assert "speculant::decode_attention" in graph and "speculant::" not in str(plain.inlined_graph)
    assert ("speculant::rms_norm" in graph) == (arch == "llama")
    ids = torch.randint(0, hf_models.VOCAB, (1, 24), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        for module in (fused, plain):
            module.prefill(ids[:, :5])
        for step in (ids[:, 5:6], ids[:, 6:11]):
            assert torch.equal(fused.extend(step), plain.extend(step))
        fused.truncate(7), plain.truncate(7)
        assert torch.equal(fused.extend(ids[:, 7:9]), plain.extend(ids[:, 7:9]))
        assert torch.equal(fused(ids), plain(ids))


def test_fused_exports_decode_a_speculative_batch_as_plain_ones_do(tmp_path):
    """The engine's batch rows ([R, 1, T, S] masks, gathered cache rows), chains of 3 and a 4-node tree, sampled
    at T = 1 with one seed: the same tokens, since on the CPU the operations are the same."""
    target, draft = export_pair("llama", tmp_path), export_pair("llama", tmp_path / "draft", hidden_size=32,
                                                                intermediate_size=48, num_hidden_layers=1)
    prompts = [p[:] for p in hf_models.PROMPTS]
    runs = {}
    for kernels in ("aten", "speculant"):
        t, d = speculant.load(str(target[kernels])), speculant.load(str(draft[kernels]))
        runs[kernels] = [[r.tokens for r in speculant.SpeculativeDecoder(t, d, **options).generate(
            prompts, max_new_tokens=12, seed=5)] for options in ({"gamma": 3}, {"tree": [2, 1, 1]})]
    assert runs["speculant"] == runs["aten"]


def test_export_refuses_fused_kernels_where_they_do_not_apply(tmp_path):
    with pytest.raises(ValueError, match="kernels must be one of"):
        speculant.export(hf_models.make("gpt2"), tmp_path / "m.pt", kernels="triton")
    with pytest.raises(ValueError, match="for TorchScript exports"):
        speculant.export(hf_models.make("gpt2"), tmp_path / "m.pt2", kernels="speculant")
    with pytest.raises(ValueError, match="decoder-only exports"):
        speculant.export(hf_models.make("t5"), tmp_path / "t5.pt", kernels="speculant")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [64, 128, 256])
@pytest.mark.parametrize("batch, heads, group, new, keys, mask_batch", [
    (1, 8, 4, 1, 257, 1), (1, 8, 4, 16, 300, 1), (1, 12, 1, 1, 4096, 1), (3, 2, 2, 5, 33, 3), (2, 4, 1, 1, 1, 1),
    (1, 1, 1, 1, 8192, 1),  # one head over many keys: the most chunks a call takes (256)
    (1, 2, 8, 16, 70, 1),  # 128 query rows: the kernel's largest call
    (1, 2, 4, 40, 50, 1)])  # 160 rows: ATen's attention
def test_cuda_decode_attention_matches_a_float64_reference(dtype, dim, batch, heads, group, new, keys, mask_batch):
    q, k, v, mask = attention_inputs(batch, heads, group, new, keys, dim, dtype, "cuda", seed=dim + keys,
                                     mask_batch=mask_batch)
    want = stacked_attention(*(t.double().cpu() for t in (q, k, v, mask)), dim ** -0.5)
    torch.cuda.synchronize()
    got = OPS.decode_attention(q, k, v, mask, dim ** -0.5)
    assert got.dtype == dtype and got.shape == q.shape
    assert relative_error(got, want) < TOLERANCES[dtype]
    # the chunks are combined in a fixed order: a second call is the same bit for bit
    assert torch.equal(OPS.decode_attention(q, k, v, mask, dim ** -0.5), got)


@pytest.mark.cuda
def test_cuda_decode_attention_is_captured_and_replayed_in_a_graph():
    q, k, v, mask = attention_inputs(1, 8, 4, 2, 257, 128, torch.bfloat16, "cuda")
    out = torch.full_like(q, float("nan"))  # poisoned: every element must be written by the replay
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        OPS.decode_attention(q, k, v, mask, 0.1)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(OPS.decode_attention(q, k, v, mask, 0.1))
    for _ in range(2):  # each replay writes every element, from the keys of the moment
        k.normal_()  # new keys: the replay must read them
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = stacked_attention(*(t.double().cpu() for t in (q, k, v, mask)), 0.1)
        assert relative_error(out, want) < TOLERANCES[torch.bfloat16]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows, width, offset", [
    (1, 4096, 0), (7, 2048, 0), (2, 12288, 0), (1, 16384, 0), (3, 100, 0), (1, 1, 0),  # one to 16 vectors a thread
    (2, 4096, 1)])  # rows not 16-byte aligned: the plain loop
def test_cuda_rms_norm_matches_a_float64_reference(dtype, rows, width, offset):
    g = torch.Generator().manual_seed(width)
    x, weight = torch.randn(rows, width, generator=g), torch.randn(width, generator=g) + 1
    storage = torch.empty(rows * width + offset, dtype=dtype, device="cuda")
    x_cuda = storage[offset:].view(rows, width).copy_(x.to(dtype))  # contiguous, `offset` elements off
    got = OPS.rms_norm(x_cuda, weight.to(dtype).cuda(), 1e-5)
    x64, w64 = x.to(dtype).double(), weight.to(dtype).double()
    want = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * w64
    assert relative_error(got, want) < TOLERANCES[dtype]


@pytest.mark.cuda
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_cuda_fused_exports_follow_the_plain_ones(arch, tmp_path):
    """Shapes the kernels take (head_dim 64): logits within float32 rounding of the plain export's, on the GPU."""
    overrides = {"hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2} if arch == "llama" else {
        "n_embd": 128, "n_head": 2}
    paths = export_pair(arch, tmp_path, **overrides)
    fused, plain = (torch.jit.load(str(paths[k]), map_location="cuda") for k in ("speculant", "aten"))
    ids = torch.randint(0, hf_models.VOCAB, (1, 24), generator=torch.Generator().manual_seed(4)).cuda()
    with torch.no_grad():
        for module in (fused, plain):
            module.prefill(ids[:, :5])
        for step in (ids[:, 5:6], ids[:, 6:11]):
            want = plain.extend(step)
            assert (fused.extend(step) - want).abs().max().item() <= 1e-4 * want.abs().max().item()


def emulated_attention(q, cache, keys, mask, scale, splits, sanitizer="address"):
    """decode_attention.cu's launcher as ops.cpp calls it, on attention_inputs' k and v (views of `cache`
    [2, B, keys + 3, H, D]); mask [T, S] or [B, 1, T, S]; `splits` chunks of the keys, or None for as many as
    ops.cpp takes on an H100 (132 multiprocessors). The output is poisoned first."""
    B, H, N, D = q.shape
    rows = (mask.unsqueeze(0) if mask.dim() == 2 else mask.squeeze(1)).contiguous()  # [Bm, T, S]
    k, v = cache[0].contiguous(), cache[1].contiguous()  # [B, keys + 3, H, D]: k = k[:, :keys].transpose(1, 2)
    kv_stride = (k.stride(0), k.stride(2), k.stride(1))
    return emulated_kernels.launch(
        "decode_attention", sanitizer, q=q, k=k, v=v, mask=rows, out=torch.full_like(q, float("nan")),
        partial=torch.full((splits * B * H * N * (D + 2),), float("nan")) if (splits or 1) > 1 else None,
        multiprocessors=132 if splits is None else None,
        q_stride=q.stride()[:3], k_stride=kv_stride, v_stride=kv_stride,
        mask_stride=(0 if rows.size(0) == 1 else rows.stride(0), rows.stride(1), rows.stride(2)), batch=B,
        heads=H, rows=N, mask_rows=rows.size(1), keys=keys, head_dim=D, splits=splits, scale=scale, dtype=q.dtype)["out"]


@emulated_kernels.needed
@pytest.mark.parametrize("dim", [64, 128, 256])
@pytest.mark.parametrize("batch, heads, group, new, keys, mask_batch, splits", [
    (1, 2, 4, 1, 70, 1, 1),  # one chunk: the first kernel writes the output
    (1, 2, 4, 1, 70, 1, 3),  # three chunks combined by the second kernel
    (3, 1, 2, 5, 33, 3, 2),  # a mask per batch row, 10 query rows: two tiles, the second in part
    (2, 1, 1, 1, 1, 1, 1),  # one key
    (1, 1, 1, 1, 2048, 1, None),  # one head over many keys: 128 chunks of 16, as ops.cpp splits them on an H100
    (1, 1, 8, 16, 24, 1, None)])  # 128 query rows a head, the most the kernel takes: 16 tiles
def test_emulated_decode_attention_matches_a_float64_reference(dim, batch, heads, group, new, keys, mask_batch,
                                                               splits):
    dtype = [torch.float32, torch.bfloat16, torch.float16][(dim // 64 + keys) % 3]
    g = torch.Generator().manual_seed(dim + keys)
    q, k, v, mask = attention_inputs(batch, heads, group, new, keys, dim, dtype, seed=dim + keys,
                                     mask_batch=mask_batch)
    cache = k.transpose(1, 2).new_empty(2, batch, keys + 3, heads, dim).normal_(generator=g)
    cache[0, :, :keys], cache[1, :, :keys] = k.transpose(1, 2), v.transpose(1, 2)
    got = emulated_attention(q, cache, keys, mask, dim ** -0.5, splits)
    want = stacked_attention(*(t.double() for t in (q, k, v, mask)), dim ** -0.5)
    assert relative_error(got, want) < TOLERANCES[dtype]


@emulated_kernels.needed
def test_emulated_decode_attention_has_no_race_on_shared_memory():
    q, k, v, mask = attention_inputs(1, 2, 4, 2, 40, 64, torch.bfloat16)
    cache = torch.zeros(2, 1, 43, 2, 64, dtype=torch.bfloat16)
    cache[0, :, :40], cache[1, :, :40] = k.transpose(1, 2), v.transpose(1, 2)
    got = emulated_attention(q, cache, 40, mask, 0.125, 2, sanitizer="thread")
    assert relative_error(got, stacked_attention(*(t.double() for t in (q, k, v, mask)), 0.125)) < 1e-2


@emulated_kernels.needed
@pytest.mark.parametrize("dtype, rows, width", [
    (torch.float32, 1, 4096), (torch.bfloat16, 7, 2048), (torch.float16, 2, 12288),  # vectors held in registers
    (torch.float32, 3, 101),  # not whole vectors: the plain loop
    (torch.bfloat16, 1, 20000)])  # more than 8 vectors a thread: the plain loop
def test_emulated_rms_norm_matches_a_float64_reference(dtype, rows, width):
    g = torch.Generator().manual_seed(width)
    x, weight = torch.randn(rows, width, generator=g).to(dtype), (torch.randn(width, generator=g) + 1).to(dtype)
    got = emulated_kernels.launch("rms_norm", x=x, weight=weight, y=torch.full_like(x, float("nan")), rows=rows,
                                  width=width, eps=1e-5, dtype=dtype)["y"]
    x64, w64 = x.double(), weight.double()
    want = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * w64
    assert relative_error(got, want) < TOLERANCES[dtype]
