"""speculant's fused operations alone, against the torch operations they replace, side by side in one run:
torch.ops.speculant.decode_attention against the exports' scaled_dot_product_attention over the stacked mask
(llama.py's Attention), at the 8B, 1.1B and GPT-2 shapes and several cache lengths;
torch.ops.speculant.rms_norm against torch.rms_norm at several widths; and each of a layer's fused linear
operations (torch.ops.speculant.linear and add_linear_: the norm with the projection after it, the gated product
or activation with the projection accumulating into the residual stream) against the torch operations an export
runs without them, at the same shapes and at 1 and 5 tokens. A kernel's floor is the bytes it reads (the keys and
values it attends; a row and the weight; a projection's weights) over the read bandwidth floor.py measures.

    python benchmarks/fused_ops.py --device cuda            # bf16; [--keys 64 257 1024 4096 16384]

On CUDA each timing replays a graph of --calls calls back to back (as a model's layers follow each other), so a
call's time is its kernels' and not the host's launches; on the CPU the calls run eagerly (the operations are the
ATen composites there: the same computation, so the ratio is about 1). Each figure: the median of --repeats
replays with min-max, after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

import floor
import kernels
import speculant  # noqa: F401  (registers torch.ops.speculant)
from graphs import median_range, sync

# name -> (key/value heads, query heads per key/value head, head size)
ATTENTION_SHAPES = {"llama-8b": (8, 4, 128), "llama-1.1b": (4, 8, 64), "gpt2": (12, 1, 64)}
NORM_WIDTHS = [2048, 4096, 8192]
# name -> the layer's fused linear operations: (part, input, K, N); a Llama's input norm with qkv, its output
# projection, its second norm with gate and up, its gated product with the down projection; GPT-2's alike
LINEAR_SHAPES = {
    "llama-8b": [("qkv", "rms_norm", 4096, 6144), ("o", "none", 4096, 4096), ("gate_up", "rms_norm", 4096, 28672),
                 ("down", "gated_silu", 14336, 4096)],
    "llama-1.1b": [("qkv", "rms_norm", 2048, 2560), ("o", "none", 2048, 2048), ("gate_up", "rms_norm", 2048, 11264),
                   ("down", "gated_silu", 5632, 2048)],
    "gpt2": [("qkv", "layer_norm", 768, 2304), ("proj", "none", 768, 768), ("fc", "layer_norm", 768, 3072),
             ("fc_proj", "gelu_tanh", 3072, 768)],
}


def timed_ms(call: Callable[[], object], device: torch.device, calls: int, repeats: int) -> List[float]:
    """ms per call: median and min-max over `repeats` timings of `calls` calls (one graph replay on CUDA)."""
    def several() -> None:
        for _ in range(calls):
            call()

    run = kernels.graphed(several, device).replay if device.type == "cuda" else call
    rounds = []
    for _ in range(repeats + 1):  # the first round warms up
        sync(device)
        start = time.perf_counter()
        if device.type == "cuda":
            run()
        else:
            for _ in range(calls):
                run()
        sync(device)
        rounds.append(1e3 * (time.perf_counter() - start) / calls)
    return median_range(rounds[1:])


def attention_row(shape: str, keys: int, device: torch.device, dtype: torch.dtype, calls: int, repeats: int,
                  bandwidth: float) -> Dict:
    """One decoding query per query head over `keys` cached keys, the batch-1 cache's views (llama.py)."""
    heads, group, dim = ATTENTION_SHAPES[shape]
    g = torch.Generator().manual_seed(keys)
    cache = torch.randn(2, heads, keys + 16, dim, generator=g).to(device, dtype)
    k, v = cache[0, :, :keys].unsqueeze(0), cache[1, :, :keys].unsqueeze(0)  # [1, H_kv, S, D]
    q = torch.randn(1, heads, group, dim, generator=g).to(device, dtype)  # the group's queries stacked
    mask = torch.zeros(1, keys, device=device, dtype=dtype)
    stacked = mask.expand(group, keys).reshape(1, 1, group, keys)
    scale = dim ** -0.5
    fused = timed_ms(lambda: torch.ops.speculant.decode_attention(q, k, v, mask, scale), device, calls, repeats)
    plain = timed_ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=stacked, scale=scale), device, calls,
                     repeats)
    read = 2 * heads * keys * dim * cache.element_size()
    return {"op": "decode_attention", "shape": shape, "keys": keys, "speculant_ms": fused, "torch_ms": plain,
            "ratio": fused[0] / plain[0], "floor_ms": 1e3 * read / bandwidth}


def norm_row(width: int, device: torch.device, dtype: torch.dtype, calls: int, repeats: int,
             bandwidth: float) -> Dict:
    g = torch.Generator().manual_seed(width)
    x = torch.randn(1, width, generator=g).to(device, dtype)
    weight = (torch.randn(width, generator=g) + 1).to(device, dtype)
    fused = timed_ms(lambda: torch.ops.speculant.rms_norm(x, weight, 1e-5), device, calls, repeats)
    plain = timed_ms(lambda: torch.rms_norm(x, [width], weight, 1e-5), device, calls, repeats)
    read = 2 * width * x.element_size()
    return {"op": "rms_norm", "width": width, "speculant_ms": fused, "torch_ms": plain, "ratio": fused[0] / plain[0],
            "floor_ms": 1e3 * read / bandwidth}


def linear_row(shape: str, part: str, input: str, k: int, n: int, tokens: int, device: torch.device,
               dtype: torch.dtype, calls: int, repeats: int, bandwidth: float) -> Dict:
    """speculant.linear (a norm's input) or add_linear_ (the rest: into a residual stream) against the export's
    torch operations without them (export/cached.py's add_linear, torch.rms_norm or F.layer_norm then F.linear)."""
    from speculant.export import cached

    g = torch.Generator(device).manual_seed(k + n)  # drawn where they run: an 8B projection's weights in ms

    def draw(*shape: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
        return (scale * torch.randn(*shape, generator=g, device=device) + shift).to(dtype)

    x = draw(tokens, 2 * k if input.startswith("gated_") else k)
    weight = draw(n, k, scale=k ** -0.5)
    bias = draw(n) if shape == "gpt2" else None
    gain, shift, residual = draw(k, shift=1.0), draw(k), draw(tokens, n)
    if input == "rms_norm":
        fused = lambda: torch.ops.speculant.linear(x, weight, bias, input, gain, None, 1e-5)  # noqa: E731
        plain = lambda: F.linear(torch.rms_norm(x, [k], gain, 1e-5), weight, bias)  # noqa: E731
    elif input == "layer_norm":
        fused = lambda: torch.ops.speculant.linear(x, weight, bias, input, gain, shift, 1e-5)  # noqa: E731
        plain = lambda: F.linear(F.layer_norm(x, [k], gain, shift, 1e-5), weight, bias)  # noqa: E731
    else:  # each call accumulates into the residual stream, as a layer's do
        fused = lambda: cached.add_linear(residual, x, weight, bias, True, input)  # noqa: E731
        plain = lambda: cached.add_linear(residual, x, weight, bias, False, input)  # noqa: E731
    read = (weight.numel() + x.numel()) * x.element_size()
    speculant_ms, torch_ms = (timed_ms(call, device, calls, repeats) for call in (fused, plain))
    return {"op": "linear", "shape": shape, "part": part, "input": input, "tokens": tokens, "k": k, "n": n,
            "speculant_ms": speculant_ms, "torch_ms": torch_ms, "ratio": speculant_ms[0] / torch_ms[0],
            "floor_ms": 1e3 * read / bandwidth}


def described(row: Dict) -> str:
    if row["op"] == "decode_attention":
        return f"{row['shape']}, {row['keys']} keys"
    if row["op"] == "linear":
        return f"{row['shape']} {row['part']} ({row['input']}, {row['k']} x {row['n']}), {row['tokens']} tokens"
    return f"width {row['width']}"


def table(rows: List[Dict]) -> str:
    lines = ["| operation | shape | speculant µs [min-max] | torch µs [min-max] | speculant / torch | floor µs |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        what = described(row)
        s0, s1, s2 = (1e3 * x for x in row["speculant_ms"])
        t0, t1, t2 = (1e3 * x for x in row["torch_ms"])
        lines.append(f"| {row['op']} | {what} | {s0:.1f} [{s1:.1f}-{s2:.1f}] | {t0:.1f} [{t1:.1f}-{t2:.1f}] | "
                     f"{row['ratio']:.2f}x | {1e3 * row['floor_ms']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> Dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shapes", nargs="+", choices=sorted(ATTENTION_SHAPES), default=sorted(ATTENTION_SHAPES))
    parser.add_argument("--keys", type=int, nargs="+", default=[64, 257, 1024, 4096, 16384])
    parser.add_argument("--widths", type=int, nargs="+", default=NORM_WIDTHS)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 5], help="rows of the linear operations' input")
    parser.add_argument("--calls", type=int, default=32, help="calls per timing (a graph of them on CUDA)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if min(args.keys + args.widths + args.tokens) < 1 or args.calls < 1 or args.repeats < 1:
        parser.error("--keys, --widths, --tokens, --calls and --repeats must be >= 1")
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    bandwidth = floor.read_bandwidth(device, nbytes=1 << 28 if device.type == "cpu" else 1 << 30)
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.machine()})"
    rows = []
    with torch.inference_mode():
        for shape in args.shapes:
            for keys in args.keys:
                rows.append(attention_row(shape, keys, device, dtype, args.calls, args.repeats, bandwidth))
        for width in args.widths:
            rows.append(norm_row(width, device, dtype, args.calls, args.repeats, bandwidth))
        for shape in args.shapes:
            for part, input, k, n in LINEAR_SHAPES[shape]:
                for tokens in args.tokens:
                    rows.append(linear_row(shape, part, input, k, n, tokens, device, dtype, args.calls, args.repeats,
                                           bandwidth))
    result = {"machine": machine, "torch": torch.__version__, "dtype": str(dtype), "read_bytes_per_s": bandwidth,
              "calls": args.calls, "repeats": args.repeats, "rows": rows}
    print(f"{machine}, torch {torch.__version__}, {dtype}, read bandwidth {bandwidth / 1e12:.2f} TB/s")
    print(table(rows))
    out = Path(args.out or Path(__file__).parent / "results" / f"fused-ops-{device.type}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
