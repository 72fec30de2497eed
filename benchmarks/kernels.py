"""Where an exported model's call goes: the kernels of one fixed-shape call (the engine's graph path: k tokens of
row 0 through `extend_rows` against max_length / 2 + k cache slots), counted and timed (issue 21).

    python benchmarks/kernels.py                                  # CPU: operations per call, ms per call
    python benchmarks/kernels.py --device cuda --models gpt2-target gpt2-draft llama-8b   # a GPU

Models, random weights (a call's cost does not depend on them): the shapes of shapes.py (`gpt2-target`,
`gpt2-draft`, `llama-1.1b`, `llama-1b`, `llama-8b`, ...), in bf16 on a GPU and float32 on a CPU (`--dtype`), at
most 512 cache positions. Each is exported by speculant.export's TorchScript modules, as the engine runs it.
`--kernels aten speculant` exports each twice, with torch's operations and with speculant's fused norms and
split-KV attention (cpp/kernels), measured side by side.

For each model and width k (`--widths`):

* operations per call (CPU: the ATen operations that compute, each with the copies it makes of its own arguments;
  views and allocations left out) or kernels per call (CUDA: the kernels the device ran), from torch.profiler
  over `--calls` calls;
* CUDA: the device's busy time per call (the kernels' durations summed), the call uncaptured (each kernel
  launched by the host) and replayed from a CUDA graph captured around it, as the engine's `cuda_graphs="on"`
  does, in ms per call: median over `--repeats` rounds of `--calls` calls, with min-max; the
  read floor (benchmarks/floor.py: the weights and the attended keys and values over the read bandwidth) beside it;
* the operations or kernels taking the most time, per call;
* plain greedy decoding of the same model through the engine (speculant.generate; on a GPU with CUDA graphs on,
  each step a replayed call), ms per new token end to end: beside the replayed call alone, what the engine adds
  per token (`--no-engine` leaves it out);
* `--inductor MODEL ...`: the same call of the transformers model itself, compiled by Inductor (torch.compile,
  fullgraph, fixed width, no CUDA graphs of its own) against transformers' StaticCache, profiled and timed the
  same way, a CUDA graph captured around it on a GPU: how much fusing the call's kernels would save against the
  TorchScript export's call.

Results: benchmarks/results/kernels-<device>.json (`--out`).
"""
from __future__ import annotations

import argparse
import collections
import json
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, List

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).parent))
import floor  # noqa: E402
import shapes  # noqa: E402
from graphs import median_range, sync  # noqa: E402

# ATen operations that compute nothing on a device: views, allocations, metadata
NOT_KERNELS = {
    "aten::view", "aten::as_strided", "aten::unsqueeze", "aten::squeeze", "aten::permute", "aten::transpose",
    "aten::t", "aten::expand", "aten::expand_as", "aten::slice", "aten::select", "aten::unbind", "aten::reshape",
    "aten::_reshape_alias", "aten::alias", "aten::detach", "aten::empty", "aten::empty_strided", "aten::empty_like",
    "aten::resize_", "aten::_unsafe_view", "aten::lift_fresh", "aten::split", "aten::split_with_sizes",
    "aten::chunk", "aten::narrow", "aten::result_type", "aten::item", "aten::_local_scalar_dense", "aten::size",
    "aten::dim", "aten::numel", "aten::resolve_conj", "aten::resolve_neg", "aten::scalar_tensor", "aten::unfold",
    "aten::flatten", "aten::unflatten", "aten::view_as", "aten::reshape_as", "aten::contiguous",
}
# copies and fills an operation makes of its own arguments or output (a Python number wrapped into a tensor, the
# bias copied into a matrix product's output, a reduction's initial value): part of that operation where they sit
# under it, not kernels of their own
CONVERSIONS = {"aten::to", "aten::_to_copy", "aten::copy_", "aten::fill_"}
# operations that a CPU computes as several but CUDA as one fused kernel: one operation each
ONE_KERNEL_ON_CUDA = {"aten::rms_norm"}  # its CUDA dispatch: aten::_fused_rms_norm
# speculant's fused operations (cpp/kernels, an export's kernels="speculant"): the kernels each launches on CUDA at
# one token, where its CPU composite is several operations; the attention's second kernel combines its key chunks
FUSED = {"speculant::rms_norm": 1, "speculant::decode_attention": 2, "speculant::linear": 1,
         "speculant::add_linear_": 1, "speculant::rotate_and_cache": 1}


def build(name: str, device: torch.device, dtype: torch.dtype, kernels: str = "aten"):
    """(transformers model and its scripted module on `device` in `dtype` with `kernels` (speculant.export's),
    weight bytes a call reads, max_length) for a shape of shapes.py."""
    from speculant.export import gpt2, llama

    model = shapes.build(name, device, dtype)
    module = llama if shapes.SHAPES[name].kind == "llama" else gpt2
    length = min(shapes.SHAPES[name].max_length, 512)  # the call attends half of it (fixed_call)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript's deprecation
        scripted = module.script(model, max_length=length, kernels=kernels)
    return model, scripted, shapes.read_weight_bytes(model), length


def timed(call: Callable[[], object], device: torch.device, calls: int, repeats: int) -> List[float]:
    """ms per call: median and min-max over `repeats` rounds of `calls` calls."""
    rounds = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        for _ in range(calls):
            call()
        sync(device)
        rounds.append(1e3 * (time.perf_counter() - start) / calls)
    return median_range(rounds)


def cpu_kernels(event) -> List[object]:
    """The operations under a profiler event that would each be a kernel on a device: an ATen operation that
    computes (not a view or an allocation) and has no such operation under it, its own conversions aside."""
    name = event.name
    if name in ONE_KERNEL_ON_CUDA:
        return [event]
    if name in FUSED:
        return [event] * FUSED[name]
    computes = name.startswith("aten::") and name not in NOT_KERNELS
    found = []
    for child in event.cpu_children:
        if computes and name not in CONVERSIONS and child.name in CONVERSIONS:
            continue  # a conversion inside this operation
        found += cpu_kernels(child)
    return found if found or not computes else [event]


def profiled(call: Callable[[], object], device: torch.device, calls: int) -> Dict:
    """Kernels (CUDA) or computing operations (CPU) per call, their time per call, and the largest."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(calls):
            with record_function("speculant::kernels_call"):
                call()
        sync(device)
    events = prof.events()
    if device.type == "cuda":
        kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA and not
                   e.name.startswith(("Memcpy", "Memset"))]
        durations = [(e.name, e.time_range.elapsed_us()) for e in kernels]
    else:
        roots = [e for e in events if e.name == "speculant::kernels_call"]
        durations = [(k.name, k.self_cpu_time_total) for root in roots for k in cpu_kernels(root)]
    by_name: Dict[str, List[float]] = collections.defaultdict(list)
    for name, us in durations:
        by_name[name].append(us)
    top = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:12]
    return {"per_call": len(durations) / calls, "busy_ms": 1e-3 * sum(us for _, us in durations) / calls,
            "counts": {name: len(us) / calls for name, us in sorted(by_name.items())},
            "top": [{"name": name, "per_call": len(us) / calls, "us_per_call": sum(us) / calls}
                    for name, us in top]}


def fixed_call(scripted, length: int, k: int, device: torch.device) -> Callable[[], torch.Tensor]:
    """The engine's fixed-shape call of k tokens (row 0 of a batch of 1, positions from length / 2, every one of
    the `length` cache slots attended under the mask), warmed up: TorchScript profiles and optimizes a method in
    its first calls."""
    scripted.start_rows(1)
    ids = torch.zeros(1, k, dtype=torch.long, device=device)
    rows = torch.zeros(1, dtype=torch.long, device=device)
    positions = torch.arange(length // 2, length // 2 + k, device=device).unsqueeze(0)  # [1, k]
    call = lambda: scripted.extend_rows(ids, rows, positions, positions, length)  # noqa: E731
    for _ in range(5):
        call()
    return call


def engine_per_token(model, length: int, device: torch.device, repeats: int, kernels: str) -> Dict:
    """Plain greedy decoding of the exported model through the engine (speculant.generate; cuda_graphs "on" on a
    GPU, where every step replays a captured call, "off" on a CPU), ms per new token end to end: a 96-token run
    minus a 24-token one over the tokens between, the median and min-max of `repeats` such pairs."""
    import speculant

    mode = "on" if device.type == "cuda" else "off"
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "model.pt"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            speculant.export(model, path, max_length=length, kernels=kernels)
        loaded = speculant.load(path, device=device)

    def run(tokens: int):
        sync(device)
        start = time.perf_counter()
        result = speculant.generate(loaded, list(range(3, 35)), max_new_tokens=tokens, temperature=0.0,
                                    cuda_graphs=mode)
        sync(device)
        return time.perf_counter() - start, len(result.tokens)

    run(96), run(24)  # the first calls, the captures
    values = []
    for _ in range(repeats):
        (long, n_long), (short, n_short) = run(96), run(24)
        if n_long - n_short < 36:
            raise RuntimeError(f"the engine's runs stopped at an end token ({n_long} and {n_short} new tokens)")
        values.append(1e3 * (long - short) / (n_long - n_short))
    return {"cuda_graphs": mode, "ms_per_token": median_range(values)}


def inductor_call(model, length: int, k: int, device: torch.device):
    """(call, reset): the transformers model's own forward of k tokens against a StaticCache of `length` positions,
    compiled by Inductor without CUDA graphs of its own (so that one can be captured around it), warmed up. Each
    call writes at the cache's position and advances it; reset() sets every layer's position back to length / 2,
    so at most length / 2k calls may run between resets."""
    import transformers

    from speculant import compiled_live

    with torch.inference_mode():
        cache = transformers.StaticCache(config=model.config, max_cache_len=length)
        model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), past_key_values=cache, use_cache=True)
        ids = torch.zeros(1, k, dtype=torch.long, device=device)
        positions = torch.arange(length // 2, length // 2 + k, device=device).unsqueeze(0)  # [1, k]
        mask = torch.ones(1, length, dtype=torch.long, device=device)  # the causal part masks (compiled_live.py)
    compiled = torch.compile(compiled_live._forward, fullgraph=True, dynamic=False)

    def reset() -> None:
        with torch.inference_mode():  # the cache's tensors are inference tensors
            for layer in cache.layers:
                layer.cumulative_length.fill_(length // 2)

    def call() -> torch.Tensor:
        with torch.inference_mode():
            return compiled(model, cache, ids, positions, mask)

    for _ in range(3):
        reset()
        call()
    reset()
    return call, reset


def timed_calls(call: Callable[[], object], reset: Callable[[], None], device: torch.device, calls: int,
                repeats: int) -> List[float]:
    """timed() for a call that advances a cache: reset before each round, untimed."""
    rounds = []
    for _ in range(repeats):
        reset()
        rounds.append(timed(call, device, calls, 1)[0])
    return median_range(rounds)


def graphed(call: Callable[[], object], device: torch.device) -> torch.cuda.CUDAGraph:
    """A CUDA graph captured around `call` after warm-up runs on a side stream, as the engine captures its calls."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            call()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph


def measure_inductor(model, length: int, k: int, device: torch.device, calls: int, repeats: int) -> Dict:
    """An Inductor row: on a GPU as an export's (the kernels counted and timed, uncaptured and replayed), on a CPU
    its time only (Inductor's fused C++ runs outside the ATen operations the CPU's count sees)."""
    call, reset = inductor_call(model, length, k, device)
    calls = min(calls, length // 2 // k)
    row = {"eager_ms": timed_calls(call, reset, device, calls, repeats)}
    if device.type == "cuda":
        reset()
        row["profile"] = profiled(call, device, calls)
        reset()
        graph = graphed(call, device)
        row["graphed_ms"] = timed_calls(graph.replay, reset, device, calls, repeats)
    return row


def measure(name: str, device: torch.device, args, kernels: str = "aten") -> Dict:
    dtype = shapes.dtype_for(device, args.dtype)
    model, scripted, weight_bytes, length = build(name, device, dtype, kernels)
    out = {"shape": name, "kernels": kernels, "weight_bytes": weight_bytes, "max_length": length, "widths": {}}
    name = label(name, kernels)
    # the call attends the cache's first length / 2 + k slots (fixed_call); its floor reads those and the weights
    element = next(model.parameters()).element_size()
    out["kv_bytes_per_slot"] = floor.kv_bytes_per_slot(model.config, element)
    if device.type == "cuda":
        out.update(floor.describe(device, min(weight_bytes, 1 << 30)))
    if args.engine:
        out["engine"] = engine_per_token(model, length, device, args.repeats, kernels)
        e = out["engine"]["ms_per_token"]
        print(f"{name}: plain decoding through the engine (cuda_graphs {out['engine']['cuda_graphs']}) {e[0]:.3f} ms "
              f"per token ({e[1]:.3f}-{e[2]:.3f})", flush=True)
    for k in args.widths:
        call = fixed_call(scripted, length, k, device)
        row = {"profile": profiled(call, device, args.calls), "eager_ms": timed(call, device, args.calls,
                                                                                  args.repeats)}
        if device.type == "cuda":
            row["graphed_ms"] = timed(graphed(call, device).replay, device, args.calls, args.repeats)
        kv_bytes = out["kv_bytes_per_slot"] * (length // 2 + k)
        for key, bandwidth in (("floor_ms", out.get("read_bytes_per_s")),
                               ("datasheet_floor_ms", out.get("datasheet_bytes_per_s"))):
            if bandwidth:
                row[key] = floor.floor_ms(weight_bytes, kv_bytes, bandwidth)
        out["widths"][k] = row
        report(name, k, row, out)
        if out["shape"] in args.inductor and kernels == "aten":
            out.setdefault("inductor", {})[k] = measure_inductor(model, length, k, device, args.calls, args.repeats)
            report(f"{name} (transformers' forward, Inductor)", k, out["inductor"][k], out)
    return out


def report(name: str, k: int, row: Dict, out: Dict) -> None:
    e = row["eager_ms"]
    line = f"{name}, k = {k}: uncaptured {e[0]:.3f} ms ({e[1]:.3f}-{e[2]:.3f})"
    if "graphed_ms" in row:
        g = row["graphed_ms"]
        line += f"; graph replay {g[0]:.3f} ms ({g[1]:.3f}-{g[2]:.3f})"
    if "floor_ms" in row:
        line += (f"; read floor {row['floor_ms']:.3f} ms (measured bandwidth)"
                 + (f", {row['datasheet_floor_ms']:.3f} ms (datasheet)" if "datasheet_floor_ms" in row else ""))
    prof = row.get("profile")
    if prof:
        unit = "kernels" if "graphed_ms" in row else "operations"
        line += f"; {prof['per_call']:.0f} {unit} per call, busy {prof['busy_ms']:.3f} ms"
    print(line, flush=True)
    for top in prof["top"] if prof else []:
        print(f"    {top['us_per_call']:9.1f} us  {top['per_call']:5.1f} x  {top['name'][:100]}")


def label(name: str, kernels: str) -> str:
    """A results entry's name: the shape's, with the fused operations' mark."""
    return name if kernels == "aten" else f"{name}, kernels=speculant"


CALL_GOALS_MS = {"llama-1.1b": 0.95, "gpt2-target": 0.25, "gpt2-draft": 0.06}  # issue 48, an H100


def summary_rows(results: Dict) -> str:
    """Markdown rows: each model's kernels (CUDA) or operations (CPU) per layer of its one-token call, against
    issue 48's goal of at most 8 (the call's own per-call work, the head and the mask, counted in); on a GPU its
    replayed call against its read floor and issue 48's goal where it states one; and transformers' forward
    compiled by Inductor where it ran, the same two figures."""
    rows = []
    for name, model in results["models"].items():
        call = model["widths"].get("1") or model["widths"].get(1)
        if call is None:
            continue
        shape = model.get("shape", name)
        layers = shapes.config(shape).num_hidden_layers if shapes.SHAPES[shape].kind == "llama" else \
            shapes.config(shape).n_layer
        per_layer = call["profile"]["per_call"] / layers
        rows.append(f"| kernels per layer, {name} one-token call | {per_layer:.1f} ({call['profile']['per_call']:.0f} "
                    f"per call, {layers} layers) | <= 8 | {'yes' if per_layer <= 8 else 'no'} |")
        if "graphed_ms" in call:
            goal = CALL_GOALS_MS.get(shape)
            g = call["graphed_ms"]
            rows.append(f"| {name} one-token call, replayed | {g[0]:.3f} ms ({g[1]:.3f}-{g[2]:.3f}), "
                        f"{g[0] / call['floor_ms']:.2f}x its {call['floor_ms']:.3f} ms read floor | "
                        + (f"<= {goal} ms | {'yes' if g[0] <= goal else 'no'} |" if goal else "- | - |"))
        plain = results["models"].get(shape, {}).get("widths", {})
        plain = plain.get("1") or plain.get(1)
        if model.get("kernels", "aten") != "aten" and plain and "graphed_ms" in call and "graphed_ms" in plain:
            ratio = call["graphed_ms"][0] / plain["graphed_ms"][0]
            rows.append(f"| {shape}: replayed call with speculant's kernels over torch's (one run) | {ratio:.2f}x "
                        f"| < 1 | {'yes' if ratio < 1 else 'no'} |")
        inductor = model.get("inductor", {}).get("1") or model.get("inductor", {}).get(1)
        if inductor and "graphed_ms" in inductor:
            g = inductor["graphed_ms"]
            rows.append(f"| {name}: transformers' forward compiled by Inductor, replayed | {g[0]:.3f} ms "
                        f"({g[1]:.3f}-{g[2]:.3f}), {inductor['profile']['per_call'] / layers:.1f} kernels per layer "
                        f"| beside the export's | - |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", nargs="+", default=["gpt2-target", "gpt2-draft"], choices=sorted(shapes.SHAPES))
    parser.add_argument("--dtype", choices=shapes.DTYPE_CHOICES, default=None, help=shapes.DTYPE_HELP)
    parser.add_argument("--widths", nargs="+", type=int, default=[1, 5])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-engine", dest="engine", action="store_false",
                        help="leave out plain decoding through the engine")
    parser.add_argument("--inductor", nargs="*", default=[], metavar="MODEL",
                        help="these models' own forward compiled by Inductor beside their export (minutes to compile)")
    parser.add_argument("--kernels", nargs="+", choices=["aten", "speculant"], default=["aten"],
                        help="the exports' operations (speculant.export's kernels=): each model once per choice, side "
                             "by side")
    parser.add_argument("--out")
    parser.add_argument("--summary", metavar="JSON", help="print a results file's kernels per layer as table rows")
    args = parser.parse_args()
    if args.summary:
        print(summary_rows(json.loads(Path(args.summary).read_text())))
        return
    if any(k < 1 for k in args.widths) or args.calls < 1 or args.repeats < 1:
        parser.error("--widths, --calls and --repeats must be >= 1")
    if set(args.inductor) - set(args.models):
        parser.error(f"--inductor: {sorted(set(args.inductor) - set(args.models))} not among --models")
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    machine = f"{platform.machine()}, {args.threads} threads, torch {torch.__version__}, " + (
        torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU")
    print(f"machine: {machine}", flush=True)
    results = {"machine": machine, "models": {}}
    out = Path(args.out or Path(__file__).parent / "results" / f"kernels-{device.type}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.inference_mode():
        for name in args.models:  # written after each model: a run cut off at a deadline keeps what it measured
            for kernels in args.kernels:
                results["models"][label(name, kernels)] = measure(name, device, args, kernels)
                out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
