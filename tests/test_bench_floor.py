"""benchmarks/floor.py: a call's floor is the bytes it must read (weights and attended keys and values) over the
read bandwidth, not a copy's time; the KV arithmetic of GPT-2- and Llama-shaped configs, the datasheet lookup,
and a read bandwidth measured on this CPU."""

import math
import os
import sys

import pytest
import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import floor  # noqa: E402


def test_kv_bytes_per_slot_follow_the_config():
    gpt2 = transformers.GPT2Config(n_layer=12, n_head=12, n_embd=768)
    assert floor.kv_bytes_per_slot(gpt2, 4) == 2 * 12 * 12 * 64 * 4  # keys and values, 12 layers, fp32
    llama = transformers.LlamaConfig(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
                                     num_key_value_heads=4)  # the 1.1B Llama: 4 key/value heads of 64
    assert floor.kv_bytes_per_slot(llama, 2) == 2 * 22 * 4 * 64 * 2
    eight_b = transformers.LlamaConfig(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                                       num_key_value_heads=8, head_dim=128)
    assert floor.kv_bytes_per_slot(eight_b, 2) == 131072  # 128 KiB per position in bf16


def test_the_floor_reads_each_byte_once():
    """The 1.1B Llama's 2.20 GB at the H100 SXM's 3.35 TB/s: 0.657 ms (the copy-based figure was 1.46 ms)."""
    assert floor.datasheet_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    assert floor.datasheet_bandwidth("NVIDIA H200") == 4.8e12
    assert floor.datasheet_bandwidth("NVIDIA H100 PCIe") == 2.0e12
    assert floor.datasheet_bandwidth("cpu") is None
    weights = 2_200_000_000
    assert floor.floor_ms(weights, 0, 3.35e12) == pytest.approx(0.6567, abs=1e-4)
    kv = floor.kv_bytes_per_slot(transformers.LlamaConfig(hidden_size=2048, num_hidden_layers=22,
                                                          num_attention_heads=32, num_key_value_heads=4), 2) * 64
    assert floor.floor_ms(weights, kv, 3.35e12) == pytest.approx(1e3 * (weights + kv) / 3.35e12)


def test_read_bandwidth_is_measured_here():
    found = floor.describe(torch.device("cpu"), nbytes=32 << 20)
    assert found["device"] == "cpu" and found["datasheet_bytes_per_s"] is None
    assert math.isfinite(found["read_bytes_per_s"]) and found["read_bytes_per_s"] > 1e8  # > 0.1 GB/s on any CPU
