"""Export time, file size and load time of speculant.export for untrained models of common shapes (built
from configs: no downloads). Prints a Markdown table.

    python benchmarks/export_sizes.py
"""
import os
import shutil
import tempfile
import time
import warnings

import torch
import transformers

import speculant

SHAPES = {
    "GPT2LMHeadModel, gpt2 (124M) shape": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config()),
    "LlamaForCausalLM, 12 layers, d 768, 12/4 heads, vocab 32000": lambda: transformers.LlamaForCausalLM(
        transformers.LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                                 num_attention_heads=12, num_key_value_heads=4, vocab_size=32000,
                                 max_position_embeddings=2048)),
    "T5ForConditionalGeneration, t5-small shape": lambda: transformers.T5ForConditionalGeneration(
        transformers.T5Config(decoder_start_token_id=0)),
    "T5ForConditionalGeneration, t5-v1_1-small shape": lambda: transformers.T5ForConditionalGeneration(
        transformers.T5Config(d_model=512, d_ff=1024, num_layers=8, num_heads=6, d_kv=64,
                              feed_forward_proj="gated-gelu", decoder_start_token_id=0)),
}


def directory_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(path, name)) for name in os.listdir(path))


def main() -> None:
    warnings.filterwarnings("ignore", message=r".*TorchScript.*")
    torch.manual_seed(0)
    print("| model | parameters | save_pretrained | exported file | export | load (+ probe) | max_length |")
    print("|---|---|---|---|---|---|---|")
    work = tempfile.mkdtemp()
    try:
        for name, build in SHAPES.items():
            model = build().eval()
            params = sum(p.numel() for p in model.parameters())
            model.save_pretrained(os.path.join(work, "hf"))
            hf_bytes = directory_size(os.path.join(work, "hf"))
            out = os.path.join(work, "model.pt")
            start = time.perf_counter()
            meta = speculant.export(os.path.join(work, "hf"), out)
            exported = time.perf_counter() - start
            start = time.perf_counter()
            speculant.load(out)
            loaded = time.perf_counter() - start
            print(f"| {name} | {params / 1e6:.1f}M | {hf_bytes / 2**20:.0f} MiB | {os.path.getsize(out) / 2**20:.0f} MiB "
                  f"| {exported:.1f} s | {loaded:.1f} s | {meta['max_length']} |", flush=True)
            shutil.rmtree(os.path.join(work, "hf"))
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
