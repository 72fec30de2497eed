"""torch.ops.speculant.linear and add_linear_ (cpp/kernels/linear.cpp): a matrix product with the norm or
activation before it and, for add_linear_, the residual add after it.

On the CPU each is the ATen composite the exports compute without it, bit for bit. The CUDA kernel (linear.cu,
calls of up to 8 rows) is checked on a GPU against float64 references computed on the CPU (marked cuda: skipped
without one): every input kind and dtype, 1 to 8 rows, widths off the kernel's column tiles, strided rows, and
the calls it leaves to ATen (more rows, widths off its 16-byte vectors, unaligned rows). The same kernel also runs
here, emulated on CPU threads under AddressSanitizer and ThreadSanitizer (tests/support/emulated_kernels.py), against
the same references.
"""
import warnings

import pytest
import torch
import torch.nn.functional as F

from support import emulated_kernels
from support.kernel_checks import TOLERANCES, relative_error

OPS = torch.ops.speculant
ACTIVATIONS = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}
INPUTS = ["none", "rms_norm", "layer_norm", "layer_norm_unbiased", "silu", "gelu", "gelu_tanh", "relu",
          "gated_silu", "gated_gelu", "gated_gelu_tanh", "gated_relu"]


def operands(input, rows, k, n, dtype, device="cpu", seed=0, bias=True):
    """(x, weight, bias, kwargs for the norm) with x [rows, k] (gated: [rows, 2k]); `input` names the case, a
    LayerNorm without its bias as "layer_norm_unbiased"."""
    g = torch.Generator().manual_seed(seed)
    width = 2 * k if input.startswith("gated_") else k
    make = lambda *shape, scale=1.0: (scale * torch.randn(*shape, generator=g)).to(dtype).to(device)  # noqa: E731
    x, weight = make(rows, width) + 0.3, make(n, k, scale=k ** -0.5)
    norm = {}
    if input in ("rms_norm", "layer_norm", "layer_norm_unbiased"):
        norm["norm_weight"] = make(k) + 1
        if input == "layer_norm":
            norm["norm_bias"] = make(k)
        norm["eps"] = 1e-5
    return x, weight, make(n) if bias else None, norm


def op_input(input: str) -> str:
    return "layer_norm" if input == "layer_norm_unbiased" else input


def composite(x, weight, bias, input, norm_weight=None, norm_bias=None, eps=0.0):
    """The input as the exports compute it (export/cached.py), then F.linear."""
    k = weight.size(1)
    if input == "rms_norm":
        u = torch.rms_norm(x, [k], norm_weight, eps)
    elif input.startswith("layer_norm"):
        u = F.layer_norm(x, [k], norm_weight, norm_bias, eps)
    elif input.startswith("gated_"):
        gate, up = x[..., :k], x[..., k:]
        kind = input[len("gated_"):]
        u = gate * torch.sigmoid(gate) * up if kind == "silu" else ACTIVATIONS[kind](gate) * up
    elif input in ACTIVATIONS:
        u = ACTIVATIONS[input](x)
    else:
        u = x
    return u, F.linear(u, weight, bias)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("input", INPUTS)
def test_linear_on_the_cpu_is_the_composite(input, dtype):
    x, weight, bias, norm = operands(input, 6, 24, 10, dtype)
    x = x.view(2, 3, -1)
    want = composite(x, weight, bias, input, **norm)[1]
    assert torch.equal(OPS.linear(x, weight, bias, op_input(input), **norm), want)
    if not norm:
        assert torch.equal(OPS.linear(x, weight, None, input), composite(x, weight, None, input)[1])


@pytest.mark.parametrize("input", ["none", "gelu_tanh", "gated_silu", "gated_gelu"])
def test_add_linear_accumulates_into_its_output_as_addmm_does(input):
    x, weight, bias, _ = operands(input, 6, 24, 10, torch.float32)
    residual = torch.randn(2, 3, 10)
    want = residual.clone().view(6, 10)
    want.addmm_(composite(x, weight, None, input)[0], weight.t()).add_(bias)
    out = residual.clone()
    got = OPS.add_linear_(out, x.view(2, 3, -1), weight, bias, input)
    assert got.data_ptr() == out.data_ptr() and torch.equal(out, want.view(2, 3, 10))


def test_bad_inputs_are_refused_naming_what_is_wrong():
    x, weight, bias, norm = operands("rms_norm", 3, 16, 8, torch.float32)
    with pytest.raises(ValueError, match="input must be none, rms_norm, layer_norm, an activation"):
        OPS.linear(x, weight, bias, "tanh")
    with pytest.raises(ValueError, match=r"x must be \[.., 32\] for weight .* \(a gated input"):
        OPS.linear(x, weight, bias, "gated_silu")
    with pytest.raises(ValueError, match=r"bias must be \[8\]"):
        OPS.linear(x, weight, bias[:5])
    with pytest.raises(ValueError, match="norm_weight is given exactly when input is rms_norm or layer_norm"):
        OPS.linear(x, weight, bias, "rms_norm")
    with pytest.raises(ValueError, match="norm_weight is given exactly when"):
        OPS.linear(x, weight, bias, "none", **norm)
    with pytest.raises(ValueError, match="norm_bias is for input = layer_norm only"):
        OPS.linear(x, weight, bias, "rms_norm", norm["norm_weight"], norm["norm_weight"], 1e-5)
    with pytest.raises(ValueError, match=r"norm_weight and norm_bias must be \[16\]"):
        OPS.linear(x, weight, bias, "rms_norm", norm["norm_weight"][:4], None, 1e-5)
    with pytest.raises(ValueError, match="weight must share x's dtype"):
        OPS.linear(x, weight.double(), bias)
    with pytest.raises(ValueError, match="input must not be a norm"):
        OPS.add_linear_(torch.zeros(3, 8), x, weight, bias, "rms_norm")
    with pytest.raises(ValueError, match=r"out must be contiguous and \[3, 8\]"):
        OPS.add_linear_(torch.zeros(3, 9), x, weight, bias)
    with pytest.raises(ValueError, match="not contiguous"):
        OPS.add_linear_(torch.zeros(8, 3).t(), x, weight, bias)
    square = torch.randn(3, 16)
    with pytest.raises(ValueError, match="out must not overlap x"):
        OPS.add_linear_(square, square, torch.randn(16, 16))


def reference(x, weight, bias, input, dtype, residual=None, **norm):
    """float64 on the CPU from the same (rounded) operands, the transformed input rounded to `dtype` as the kernel
    rounds it."""
    to64 = lambda t: None if t is None else t.double().cpu()  # noqa: E731
    u, _ = composite(to64(x), to64(weight), None, input, **{k: to64(v) if k != "eps" else v for k, v in norm.items()})
    out = u.to(dtype).double() @ to64(weight).t()
    if bias is not None:
        out += to64(bias)
    return out if residual is None else out + to64(residual)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("input", INPUTS)
@pytest.mark.parametrize("rows, k, n", [(1, 4096, 64), (2, 512, 1000), (3, 256, 37), (5, 2048, 96), (8, 768, 130),
                                        (9, 256, 64),  # more rows than the kernel takes: ATen's
                                        (2, 102, 33)])  # not whole 16-byte vectors: ATen's
def test_cuda_linear_matches_a_float64_reference(dtype, input, rows, k, n):
    x, weight, bias, norm = operands(input, rows, k, n, dtype, "cuda", seed=k + n)
    kernel = rows <= 8 and k % 8 == 0
    got = launched(lambda: OPS.linear(x, weight, bias, op_input(input), **norm), kernel)
    assert got.dtype == dtype and got.shape == (rows, n)
    assert relative_error(got, reference(x, weight, bias, input, dtype, **norm)) < TOLERANCES[dtype]
    assert torch.equal(OPS.linear(x, weight, bias, op_input(input), **norm), got)  # the same bits again
    residual = torch.randn(rows, n, generator=torch.Generator().manual_seed(1)).to(dtype).cuda()
    if not norm:
        out = residual.clone()
        launched(lambda: OPS.add_linear_(out, x, weight, bias, input), kernel)
        assert relative_error(out, reference(x, weight, bias, input, dtype, residual)) < TOLERANCES[dtype]


def launched(call, kernel: bool):
    """call()'s result, checking that it ran linear.cu's kernel exactly when `kernel` (else ATen's operations)."""
    with warnings.catch_warnings():  # what a torch's profiler says of itself is no failure of the kernel's
        warnings.simplefilter("ignore")
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            result = call()
            torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert any("linear_rows" in name for name in names) == kernel, names
    return result


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cuda_linear_reads_strided_and_unaligned_rows(dtype):
    """Rows inside a wider tensor (the kernel reads them with their stride), rows off 16-byte boundaries and a
    strided norm weight (ATen's); a 3-d input."""
    x, weight, bias, norm = operands("rms_norm", 4, 256, 64, dtype, "cuda")
    wide = torch.zeros(4, 256 + 64, dtype=dtype, device="cuda")
    wide[:, :256] = x
    shifted = torch.zeros(4 * 256 + 1, dtype=dtype, device="cuda")[1:].view(4, 256).copy_(x)
    want = reference(x, weight, bias, "rms_norm", dtype, **norm)
    for rows, kernel in ((wide[:, :256], True), (shifted, False), (x.view(2, 2, 256), True)):
        got = launched(lambda: OPS.linear(rows, weight, bias, "rms_norm", **norm), kernel).reshape(4, 64)
        assert relative_error(got, want) < TOLERANCES[dtype]
    strided_gain = torch.stack((norm["norm_weight"], norm["norm_weight"]), 1)[:, 0]  # not packed: ATen's
    got = launched(lambda: OPS.linear(x, weight, bias, "rms_norm", strided_gain, None, 1e-5), False)
    assert relative_error(got, want) < TOLERANCES[dtype]


@pytest.mark.cuda
def test_cuda_linear_is_captured_and_replayed_in_a_graph():
    x, weight, bias, norm = operands("rms_norm", 1, 1024, 512, torch.bfloat16, "cuda")
    h, down, _, _ = operands("gated_silu", 1, 256, 1024, torch.bfloat16, "cuda", seed=2)
    out = torch.full((1, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    residual = torch.zeros(1, 1024, dtype=torch.bfloat16, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside the capture
        OPS.linear(x, weight, bias, "rms_norm", **norm)
        OPS.add_linear_(residual.clone(), h, down, None, "gated_silu")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(OPS.linear(x, weight, bias, "rms_norm", **norm))
        OPS.add_linear_(residual, h, down, None, "gated_silu")
    for _ in range(2):  # each replay reads the inputs of the moment and writes every element
        x.normal_(), h.normal_()
        out.fill_(float("nan")), residual.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert relative_error(out, reference(x, weight, bias, "rms_norm", torch.bfloat16, **norm)) < 1e-2
        want = reference(h, down, None, "gated_silu", torch.bfloat16, torch.zeros(1, 1024))
        assert relative_error(residual, want) < 1e-2


def emulated(x, weight, bias, input, residual=None, x_stride=None, sanitizer="address", **norm):
    """linear.cu's launcher on x [rows, width] stored with row stride `x_stride` (the padding NaN, which the kernel
    must not read), as linear.cpp calls it: the output poisoned, or `residual` accumulated into."""
    rows, width = x.shape
    n, k = weight.shape
    stored = torch.full((rows, x_stride or width), float("nan"), dtype=x.dtype)
    stored[:, :width] = x
    out = torch.full((rows, n), float("nan"), dtype=x.dtype) if residual is None else residual.clone()
    name = op_input(input)
    kind, activation = ("gated", name[len("gated_"):]) if name.startswith("gated_") else (
        ("activation", name) if name in ACTIVATIONS else (name, "identity"))
    return emulated_kernels.launch(
        "linear", sanitizer, x=stored, weight=weight, bias=bias, norm_weight=norm.get("norm_weight"),
        norm_bias=norm.get("norm_bias"), out=out, x_stride=stored.size(1), out_stride=n, rows=rows, n=n, k=k,
        eps=norm.get("eps", 0.0), input=kind, activation=activation, accumulate=int(residual is not None),
        dtype=x.dtype)["out"]


@emulated_kernels.needed
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("input", INPUTS)
@pytest.mark.parametrize("rows, k, n, x_stride", [
    (1, 2048, 48, None),  # whole chunks of K (bf16: one; float32: two)
    (3, 2312, 37, 2312 * 2 + 16),  # a last chunk in part; the 4-row kernel with a row unused; padded rows
    (7, 256, 20, None)])  # the 8-row kernel; a last column tile in part
def test_emulated_linear_kernel_matches_a_float64_reference(dtype, input, rows, k, n, x_stride):
    x, weight, bias, norm = operands(input, rows, k, n, dtype, seed=k + n)
    got = emulated(x, weight, bias, input, x_stride=x_stride, **norm)
    assert relative_error(got, reference(x, weight, bias, input, dtype, **norm)) < TOLERANCES[dtype]
    if not norm and rows == 3:  # add_linear_: the residual accumulated into
        residual = torch.randn(rows, n, generator=torch.Generator().manual_seed(1)).to(dtype)
        got = emulated(x, weight, bias, input, residual, x_stride)
        assert relative_error(got, reference(x, weight, bias, input, dtype, residual)) < TOLERANCES[dtype]


@emulated_kernels.needed
@pytest.mark.parametrize("input, dtype, rows, k, n", [("rms_norm", torch.bfloat16, 3, 2312, 37),
                                                      ("layer_norm", torch.float32, 8, 1024, 20),
                                                      ("gated_silu", torch.float16, 2, 512, 16)])
def test_emulated_linear_kernel_has_no_race_on_shared_memory(input, dtype, rows, k, n):
    x, weight, bias, norm = operands(input, rows, k, n, dtype)
    got = emulated(x, weight, bias, input, sanitizer="thread", **norm)
    assert relative_error(got, reference(x, weight, bias, input, dtype, **norm)) < TOLERANCES[dtype]
