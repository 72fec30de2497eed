"""The floor of a decoding call: the bytes it must read over the device's read bandwidth.

A call of a memory-bound decoder reads each weight once and the keys and values of the positions it attends; it
writes next to nothing. So its floor is

    (weight bytes + KV bytes read) / read bandwidth

with the read bandwidth measured by a read-only kernel (a sum over a block far larger than the caches, one pass,
one number out), and the datasheet figure beside it. A device-to-device copy reads and writes every byte, so the
copy bandwidth counted "each way" (bytes over half the copy's total rate) is the time to copy the weights, about
twice the time to read them: the benchmarks' earlier "weight-streaming floor".

    python benchmarks/floor.py                # this machine's read bandwidth, and the datasheet figure on a GPU
"""

from __future__ import annotations

import statistics
import time
from typing import Optional

import torch

# Datasheet memory bandwidth, bytes per second, by the name torch.cuda.get_device_name gives (a part of it).
DATASHEET = {
    "H100 80GB HBM3": 3.35e12,  # H100 SXM5
    "H100 PCIe": 2.0e12,
    "H100 NVL": 3.9e12,
    "H200": 4.8e12,  # H200 SXM 141 GB HBM3e
    "A100-SXM4-80GB": 2.039e12,
    "A100-SXM4-40GB": 1.555e12,
    "A100 80GB PCIe": 1.935e12,
    "L40S": 0.864e12,
}


def datasheet_bandwidth(name: str) -> Optional[float]:
    """The datasheet bandwidth of the device called `name` (the longest table key it contains), or None."""
    keys = sorted((key for key in DATASHEET if key in name), key=len, reverse=True)
    return DATASHEET[keys[0]] if keys else None


def read_bandwidth(device: torch.device, nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Bytes per second one read pass reaches: the median over `repeats` sums of an `nbytes` float32 block, after
    three untimed ones (CUDA events on a GPU, the wall clock on a CPU)."""
    block = torch.ones(max(nbytes // 4, 1), dtype=torch.float32, device=device)
    for _ in range(3):
        block.sum()
    seconds = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            block.sum()
            end.record()
            end.synchronize()
            seconds.append(start.elapsed_time(end) / 1e3)
        else:
            began = time.perf_counter()
            block.sum()
            seconds.append(time.perf_counter() - began)
    return block.numel() * 4 / statistics.median(seconds)


def kv_bytes_per_slot(config, element_size: int) -> int:
    """Bytes of keys and values one cached position holds across the layers of a transformers decoder config
    (GPT-2's n_layer / n_head / n_embd names or Llama's, with grouped key/value heads and head_dim)."""
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    heads = getattr(config, "num_attention_heads", None) or config.n_head
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    hidden = getattr(config, "hidden_size", None) or config.n_embd
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return 2 * layers * kv_heads * head_dim * element_size


def floor_ms(weight_bytes: int, kv_bytes: int, bandwidth: float) -> float:
    """Milliseconds to read a call's weights and the keys and values it attends at `bandwidth` bytes/s."""
    return 1e3 * (weight_bytes + kv_bytes) / bandwidth


def describe(device: torch.device, nbytes: int = 1 << 30) -> dict:
    """The device's measured read bandwidth and its datasheet figure (None where the table has no entry)."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device": name, "read_bytes_per_s": read_bandwidth(device, nbytes),
            "datasheet_bytes_per_s": datasheet_bandwidth(name)}


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    found = describe(device)
    sheet = found["datasheet_bytes_per_s"]
    print(f"{found['device']}: read bandwidth {found['read_bytes_per_s'] / 1e9:.1f} GB/s measured"
          + (f", datasheet {sheet / 1e9:.0f} GB/s" if sheet else ""))


if __name__ == "__main__":
    main()
