"""benchmarks/kernels.py's operation counts on small exports (CPU), and what they show of the exports' calls: the
attention mask made once per call, not converted in every layer; a Llama layer's projections fused into four
matrix products (q, k and v in one, gate and up in one, the other two accumulating into the residual stream),
its queries, keys and values rotated in one pass, and its shared key/value heads attended without copying them
per query head."""

import json
import os
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from support.hf_models import make
from speculant.export import gpt2, llama

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import kernels  # noqa: E402

CPU = torch.device("cpu")
RESULTS = Path(__file__).parent.parent / "benchmarks" / "results"


def counts(scripted, length: int, k: int):
    call = kernels.fixed_call(scripted, length, k, CPU)
    profiled = kernels.profiled(call, CPU, calls=2)
    assert profiled["per_call"] == sum(profiled["counts"].values())
    return profiled["counts"], call


def attention(found) -> float:
    return sum(n for name, n in found.items() if "scaled_dot_product" in name)


def test_gpt2_call_makes_its_mask_once():
    model = make("gpt2")  # 2 layers, untied head
    found, _ = counts(gpt2.script(model), 96, 3)
    assert attention(found) == 2
    # qkv and the MLP's first projection (each with its bias); the attention's and the MLP's output projections
    # accumulate into the residual stream (addmm_), then add their biases
    assert found["aten::addmm"] == 2 * 2 and found["aten::addmm_"] == 2 * 2 and found["aten::add_"] == 2 * 2
    assert found["aten::mm"] == 1  # the head
    assert found["aten::where"] == 1  # one additive mask for both layers (not a conversion in each)
    assert found["aten::_index_put_impl_"] == 2  # each layer's keys and values into the cache, in one write


def test_llama_layer_fuses_its_projections_and_shares_key_value_heads():
    model = make("llama")  # 2 layers, 4 query heads over 2 key/value heads
    found, call = counts(llama.script(model), 128, 3)
    assert attention(found) == 2
    # qkv and gate_up per layer, the head; o and down accumulate into the residual stream (addmm_), so a layer
    # has no residual add of its own: its one add is the rotation's
    assert found["aten::mm"] == 2 * 2 + 1 and found["aten::addmm_"] == 2 * 2 and found["aten::add"] == 2
    # per layer one rotation of queries, keys and values together (the values by the identity), whose output the
    # cache write reads as it is (no stack); per call the two head tables
    assert "aten::neg" not in found and "aten::stack" not in found and found["aten::cat"] == 2 * 1 + 2
    assert found["aten::_index_put_impl_"] == 2
    assert found["aten::where"] == 1 and "aten::copy_" not in found  # the mask made in the model's dtype, float32
    # each RMSNorm one torch.rms_norm (one fused kernel on CUDA), not transformers' cast, square, mean, rsqrt, scale
    assert found["aten::rms_norm"] == 2 * 2 + 1 and not {"aten::pow", "aten::rsqrt", "aten::mean"} & set(found)
    # a layer: 2 norms, 4 matrix products, attention, the cache write, the rotation (2 mul, cat, add: one kernel
    # of TorchScript's CUDA fuser), the gated product (sigmoid and 2 mul: fused likewise), and at this width
    # (3 tokens) 2 copies (the queries stacked per key/value head, the attention's output): 17, 10 kernels on
    # CUDA at one token. Per call: the mask (arange, le, where) and its copy per query head, the rotary tables'
    # gathers and their head tables (ones, zeros, 2 cat), the embedding, the final norm, the head
    assert found["aten::sigmoid"] == 2 and "aten::silu" not in found
    assert found["aten::clone"] == 2 * 2 + 1
    assert sum(found.values()) == 2 * 17 + 13
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    names = {e.name for e in prof.events()}
    assert "aten::repeat_interleave" not in names and "aten::_scaled_dot_product_flash_attention_for_cpu" in names


def test_fused_llama_runs_speculants_norms_and_attention():
    """kernels="speculant": every norm and attention is one of speculant's operations (the attention two kernels on
    CUDA: its key chunks and their combination), and the mask is no longer copied per query head."""
    model = make("llama")
    found, _ = counts(llama.script(model, kernels="speculant"), 128, 3)
    plain, _ = counts(llama.script(model), 128, 3)
    # the final norm alone; each layer's norms are inside its projections (speculant::linear)
    assert found["speculant::rms_norm"] == 1 and "aten::rms_norm" not in found
    assert found["speculant::decode_attention"] == 2 * 2 and attention(found) == 0
    assert found["aten::clone"] == plain["aten::clone"] - 1
    assert found["aten::mm"] == 1 and "aten::addmm_" not in found  # the head; the layers' products are fused


def layer_counts(module, arch: str, kernels: str, k: int) -> dict:
    """One layer's operations in a k-token call: a 3-layer model's less a 2-layer one's."""
    key = "n_layer" if arch == "gpt2" else "num_hidden_layers"
    two, three = (counts(module.script(make(arch, **{key: n}), kernels=kernels), 96, k)[0] for n in (2, 3))
    return {name: three.get(name, 0) - two.get(name, 0) for name in set(two) | set(three)
            if three.get(name, 0) != two.get(name, 0)}


def test_fused_layers_launch_at_most_8_kernels_at_one_token():
    """Issue 48's goal, counted on the CPU: a fused layer's operations at one token, each speculant operation as
    the kernels it launches on CUDA (kernels.FUSED). A Llama layer: its two norms inside the qkv and gate/up
    projections (speculant::linear), the output and down projections accumulating into the residual stream, the
    down projection's input the gated product (speculant::add_linear_), the rotation with the cache write
    (speculant::rotate_and_cache) and the attention's two kernels: 7 kernels. A GPT-2 block: the same, its cache
    write an index_put of its own and no rotation: 7. Without speculant's operations, 10 and 9 (before cuBLAS's
    split-K reductions). A fused Llama call's own work has no rotary head tables (the rotation broadcasts its
    tables over the heads): 8 operations beside its layers, against 12."""
    fused = {"speculant::linear": 2, "speculant::add_linear_": 2, "speculant::decode_attention": 2}
    assert layer_counts(llama, "llama", "speculant", 1) == {**fused, "speculant::rotate_and_cache": 1}
    assert layer_counts(gpt2, "gpt2", "speculant", 1) == {**fused, "aten::_index_put_impl_": 1}
    assert sum(fused.values()) + 1 == 7
    plain = layer_counts(llama, "llama", "aten", 1)
    assert sum(plain.values()) - 3 - 2 == 10  # the rotation's 4 and the gate's 3 (sigmoid, 2 mul) one kernel each
    for kernels, own in (("speculant", 8), ("aten", 12)):
        call = counts(llama.script(make("llama"), kernels=kernels), 96, 1)[0]  # 2 layers
        per_layer = layer_counts(llama, "llama", kernels, 1)
        assert sum(call.values()) - 2 * sum(per_layer.values()) == own


def test_cpu_kernels_leave_out_views_and_conversions():
    x, w, b = torch.randn(2, 8), torch.randn(4, 8), torch.randn(4)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("speculant::kernels_call"):
            y = torch.nn.functional.linear(x, w, b).view(8)  # one: addmm (its bias copy inside it)
            z = (y + 1.0).unsqueeze(0)  # one: add (the number's conversion inside it)
            torch.cat((z.to(torch.float64), z[:, :2].t().reshape(2)[None]), dim=1)  # a conversion of its own, cat
    root = next(e for e in prof.events() if e.name == "speculant::kernels_call")
    assert sorted(e.name for e in kernels.cpu_kernels(root)) == ["aten::add", "aten::addmm", "aten::cat",
                                                                  "aten::copy_"]


def test_inductor_call_keeps_its_cache_in_bounds():
    """The transformers model's own forward compiled by Inductor (its CPU time only): each round of calls starts
    at the cache's middle, and no round runs past the cache's end (96 positions, width 5: at most 9 calls)."""
    model = make("gpt2")
    call, reset = kernels.inductor_call(model, 96, 5, CPU)
    with torch.inference_mode():
        logits = call()
        assert logits.shape == (1, 5, model.config.vocab_size) and torch.isfinite(logits).all()
        row = kernels.measure_inductor(model, 96, 5, CPU, calls=100, repeats=2)
    assert set(row) == {"eager_ms"} and 0 < row["eager_ms"][1] <= row["eager_ms"][0] <= row["eager_ms"][2]


def test_summary_rows_hold_the_kernels_the_replayed_call_and_inductor():
    """A recorded H100 run (commit 23651cd) with an Inductor row added: each figure lands in its row, against the
    goal issue 48 states for that model."""
    results = json.loads((RESULTS / "kernels-h100-23651cd.json").read_text())
    one = results["models"]["llama-1.1b"]["widths"]["1"]
    results["models"]["llama-1.1b"]["inductor"] = {"1": {"graphed_ms": [0.9, 0.89, 0.91],
                                                         "profile": {"per_call": 22 * 6.0}}}
    rows = kernels.summary_rows(results).splitlines()
    assert rows[0].startswith("| kernels per layer, llama-1.1b one-token call | 14.4 (316 per call, 22 layers)")
    g, floor_ms = one["graphed_ms"], one["floor_ms"]
    assert rows[1] == (f"| llama-1.1b one-token call, replayed | {g[0]:.3f} ms ({g[1]:.3f}-{g[2]:.3f}), "
                       f"{g[0] / floor_ms:.2f}x its {floor_ms:.3f} ms read floor | <= 0.95 ms | no |")
    assert rows[2] == ("| llama-1.1b: transformers' forward compiled by Inductor, replayed | 0.900 ms (0.890-0.910), "
                       "6.0 kernels per layer | beside the export's | - |")
    assert rows[3].startswith("| kernels per layer, llama-8b one-token call | 15.2") and rows[4].endswith("- | - |")
