"""speculant.export: transformers models -> TorchScript files in the engine's cached contract.

Every exported file is checked against transformers' own logits (max abs difference <= 1e-4 in float32) for
the prefill at several lengths, for incremental steps with the cache, and after a truncation; the metadata,
the refusals, the command line and a fresh process are checked as well. T5's module is checked in detail in
test_export_t5.py; here it goes through the same export path as the decoder-only models.
"""

import json
import os
import subprocess
import sys

import pytest
import torch
import transformers

from support import hf_models
import speculant
from speculant.export import METADATA_FILE
from support.live_reference import hf_logits

TOLERANCE = 1e-4

# (architecture, config overrides): the variants each exporter must compute as transformers does
VARIANTS = [
    ("gpt2", {}),
    ("gpt2", {"activation_function": "relu", "scale_attn_by_inverse_layer_idx": True, "n_inner": 80}),
    ("gpt2", {"tie_word_embeddings": True}),  # every released GPT-2 ties its head (hf_models unties it)
    ("llama", {}),  # grouped-query attention (4 query heads, 2 key/value heads), untied head
    ("llama", {"num_key_value_heads": 4, "tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True}),
    ("llama", {"num_key_value_heads": 1, "head_dim": 24, "rope_parameters": {
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32}}),
    ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}}),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                   "original_max_position_embeddings": 32}}),
]


def check_cached_module(module, model, ids: torch.Tensor, source: torch.Tensor | None = None) -> None:
    """prefill at lengths 1, 5 and 17; extend by 1 and 3; truncate and extend other tokens; all against
    transformers' logits of the same full sequence."""
    def close(got, want, what):
        diff = (got - want).abs().max().item()
        assert diff <= TOLERANCE, f"{what}: max |exported - transformers| = {diff:.3g}"

    reference = hf_logits(model, ids, source)  # [1, N, V]
    with torch.no_grad():
        for length in (1, 5, 17):
            if source is not None:
                module.encode(source)
            close(module.prefill(ids[:, :length]), reference[:, :length], f"prefill({length})")
        close(module.extend(ids[:, 17:18]), reference[:, 17:18], "extend(1)")
        close(module.extend(ids[:, 18:21]), reference[:, 18:21], "extend(3)")
        assert module.cache_length() == 21
        module.truncate(12)
        other = ids.clone()
        other[:, 12:] = (ids[:, 12:] * 7 + 3) % hf_models.VOCAB  # different continuation after the rollback
        close(module.extend(other[:, 12:20]), hf_logits(model, other, source)[:, 12:20], "extend after truncate")
        assert module.cache_length() == 20


@pytest.mark.parametrize("arch, overrides", VARIANTS, ids=lambda v: str(v) if isinstance(v, str) else
                         ",".join(f"{k}" for k in v) or "default")
def test_exported_logits_match_transformers(arch, overrides, tmp_path):
    model = hf_models.make(arch, seed=1, **overrides)
    path = tmp_path / "model.pt"
    meta = speculant.export(model, path)
    assert meta["architecture"] == hf_models.CLASSES[arch]
    module = torch.jit.load(str(path))
    ids = torch.randint(0, hf_models.VOCAB, (1, 24), generator=torch.Generator().manual_seed(2))
    check_cached_module(module, model, ids)
    with torch.no_grad():  # the stateless forward leaves the cache alone
        assert (module(ids) - hf_logits(model, ids)).abs().max().item() <= TOLERANCE
    assert module.cache_length() == 20


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_files_hold_no_cache(arch, tmp_path):
    """The KV cache is allocated at the first prefill: a saved file holds the weights, not max_length
    positions of zeros, and extend before any prefill is refused."""
    speculant.export(hf_models.make(arch), tmp_path / "m.pt")
    module = torch.jit.load(str(tmp_path / "m.pt"))
    assert module.cache.numel() == 0
    with pytest.raises(torch.jit.Error, match="call prefill first"):
        module.extend(torch.tensor([[1]]))
    module.prefill(torch.tensor([[1, 2]]))
    assert list(module.cache.shape) == module.cache_shape


def test_t5_exports_through_the_same_path(tmp_path):
    model = hf_models.make("t5", seed=1)
    meta = speculant.export(model, tmp_path / "t5.pt", max_length=64, max_source_length=32)
    assert meta["encoder_decoder"] and meta["decoder_start_token_id"] == 0
    module = torch.jit.load(str(tmp_path / "t5.pt"))
    generator = torch.Generator().manual_seed(3)
    source = torch.randint(0, hf_models.VOCAB, (1, 11), generator=generator)
    ids = torch.randint(0, hf_models.VOCAB, (1, 24), generator=generator)
    check_cached_module(module, model, ids, source)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "t5"])
def test_save_pretrained_directory_round_trip(arch, tmp_path):
    model = hf_models.make(arch, seed=4)
    model.save_pretrained(tmp_path / "hf")
    speculant.export(tmp_path / "hf", tmp_path / "from_dir.pt")
    speculant.export(model, tmp_path / "from_object.pt")
    a, b = torch.jit.load(str(tmp_path / "from_dir.pt")), torch.jit.load(str(tmp_path / "from_object.pt"))
    ids = torch.tensor([[5, 9, 3, 17, 1]])
    with torch.no_grad():
        if arch == "t5":
            a.encode(ids), b.encode(ids)
        assert torch.equal(a.prefill(ids), b.prefill(ids))


@pytest.mark.parametrize("arch", ["gpt2", "llama", "t5"])
def test_metadata_is_written_and_loaded(arch, tmp_path):
    model = hf_models.make(arch, seed=0)
    path = tmp_path / "m.pt"
    speculant.export(model, path)
    loaded = speculant.load(path)
    assert loaded.form == "cached"
    assert loaded.vocab_size == hf_models.VOCAB
    assert loaded.encoder_decoder == (arch == "t5")
    meta = loaded.metadata
    assert meta["architecture"] == hf_models.CLASSES[arch] and meta["model_type"] == arch
    assert meta["vocab_size"] == hf_models.VOCAB and meta["eos_token_id"] == hf_models.EOS
    assert loaded.eos_token_id == hf_models.EOS
    assert loaded.decoder_start_token_id == (0 if arch == "t5" else None)
    assert meta["transformers_version"] == transformers.__version__
    extra = {METADATA_FILE: ""}
    torch.jit.load(str(path), _extra_files=extra)
    assert json.loads(extra[METADATA_FILE]) == meta


def test_unsupported_architecture_is_refused_naming_the_supported_ones(tmp_path):
    torch.manual_seed(0)
    opt = transformers.OPTForCausalLM(transformers.OPTConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                                                             ffn_dim=64, num_attention_heads=2,
                                                             word_embed_proj_dim=32))
    with pytest.raises(ValueError, match="OPTForCausalLM is not supported.*GPT2LMHeadModel, LlamaForCausalLM, "
                                         "T5ForConditionalGeneration"):
        speculant.export(opt, tmp_path / "x.pt")
    opt.save_pretrained(tmp_path / "opt")
    with pytest.raises(ValueError, match="OPTForCausalLM.*supported architectures"):
        speculant.export(tmp_path / "opt", tmp_path / "x.pt")
    with pytest.raises(ValueError, match="GPT2Model is not supported"):
        speculant.export(transformers.GPT2Model(hf_models.make("gpt2").config), tmp_path / "x.pt")
    with pytest.raises(FileNotFoundError, match="missing does not exist"):
        speculant.export(tmp_path / "missing", tmp_path / "x.pt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a save_pretrained directory"):
        speculant.export(tmp_path / "empty", tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()


def test_torchscript_refusal_points_to_pt2(tmp_path):
    """Issue 25: Qwen2 (and any architecture without a TorchScript module of ours) is refused naming the format
    that exports it: pt2 (tests/test_pt2_decoding.py decodes Qwen2 packages), or running it live."""
    from support import hf_families

    qwen2 = hf_families.make("qwen2")
    hint = r"format='pt2' \(an out_path ending in \.pt2; on the command line --format pt2\).*speculant\.load"
    with pytest.raises(ValueError, match=r"Qwen2ForCausalLM is not supported; supported architectures "
                                         r"\(TorchScript\): GPT2LMHeadModel.*" + hint):
        speculant.export(qwen2, tmp_path / "x.pt")
    qwen2.save_pretrained(tmp_path / "qwen2")
    with pytest.raises(ValueError, match="Qwen2ForCausalLM.*" + hint):
        speculant.export(tmp_path / "qwen2", tmp_path / "x.pt")
    llama_named_mistral = transformers.LlamaForCausalLM(hf_models.make("llama").config)
    llama_named_mistral.config.model_type = "mistral"
    with pytest.raises(ValueError, match="model_type = 'mistral' is not supported.*" + hint):
        speculant.export(llama_named_mistral.eval(), tmp_path / "x.pt")
    assert not (tmp_path / "x.pt").exists()


@pytest.mark.parametrize("arch, overrides, field", [
    ("gpt2", {"activation_function": "quick_gelu"}, "activation_function"),
    ("gpt2", {"add_cross_attention": True}, "add_cross_attention"),
    ("llama", {"hidden_act": "quick_gelu"}, "hidden_act"),
    ("llama", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}}, "rope_type"),
])
def test_unsupported_configuration_is_refused_naming_the_field(arch, overrides, field, tmp_path):
    with pytest.raises(ValueError, match=field):
        speculant.export(hf_models.make(arch, **overrides), tmp_path / "x.pt")


def test_max_length_is_checked(tmp_path):
    with pytest.raises(ValueError, match=r"max_length must be in \[1, n_positions = 96\]"):
        speculant.export(hf_models.make("gpt2"), tmp_path / "x.pt", max_length=97)
    with pytest.raises(ValueError, match="max_source_length is only for encoder-decoder"):
        speculant.export(hf_models.make("llama"), tmp_path / "x.pt", max_source_length=8)
    speculant.export(hf_models.make("llama"), tmp_path / "short.pt", max_length=10)
    model = speculant.load(tmp_path / "short.pt")
    assert model.max_length == 10
    with pytest.raises(ValueError, match="max_length = 10"):
        speculant.generate(model, [1, 2, 3], max_new_tokens=9)


def test_pair_with_different_vocabularies_is_refused(tmp_path):
    speculant.export(hf_models.make("gpt2"), tmp_path / "target.pt")
    speculant.export(hf_models.make("llama", vocab_size=80), tmp_path / "draft.pt")
    target, draft = speculant.load(tmp_path / "target.pt"), speculant.load(tmp_path / "draft.pt")
    with pytest.raises(ValueError, match="vocabularies differ: target vocab_size = 64, draft vocab_size = 80"):
        speculant.SpeculativeDecoder(target, draft, gamma=2)


def test_vocabulary_mismatch_advice_fits_exported_files(tmp_path):
    """Issue 25: the advice named load(..., vocab_size=), which pads live models only; for files it must say
    what works (load the model from transformers), and load must refuse vocab_size= for a file saying so."""
    speculant.export(hf_models.make("gpt2"), tmp_path / "target.pt")
    speculant.export(hf_models.make("llama", vocab_size=80), tmp_path / "draft.pt")
    with pytest.raises(ValueError, match=r"not a file \(.*target\.pt\): an exported file keeps the vocabulary it "
                                         r"was exported with, so load that model from transformers"):
        speculant.load(tmp_path / "target.pt", vocab_size=80)
    target, draft = speculant.load(tmp_path / "target.pt"), speculant.load(tmp_path / "draft.pt")
    with pytest.raises(ValueError, match=r"transformers model or save_pretrained directory with "
                                         r"speculant\.load\(model_or_dir, vocab_size=<the larger size>\).*an "
                                         r"exported file \(\.pt, \.pt2\) keeps the vocabulary it was exported with"):
        speculant.SpeculativeDecoder(target, draft, gamma=2)


def test_encoder_decoder_and_decoder_only_do_not_pair(tmp_path):
    speculant.export(hf_models.make("gpt2"), tmp_path / "gpt2.pt")
    speculant.export(hf_models.make("t5"), tmp_path / "t5.pt")
    gpt2, t5 = speculant.load(tmp_path / "gpt2.pt"), speculant.load(tmp_path / "t5.pt")
    with pytest.raises(ValueError, match="must both be encoder-decoder models or both decoder-only"):
        speculant.SpeculativeDecoder(t5, gpt2, gamma=2)
    with pytest.raises(ValueError, match="pass encoder_input_ids"):
        speculant.generate(t5, max_new_tokens=3)
    with pytest.raises(ValueError, match="encoder_input_ids is only for encoder-decoder"):
        speculant.generate(gpt2, [1, 2], encoder_input_ids=[3, 4], max_new_tokens=3)
    with pytest.raises(ValueError, match="prompt_ids is required"):
        speculant.generate(gpt2, max_new_tokens=3)
    with pytest.raises(ValueError, match=r"encoder_input_ids\[1\] = 64 is outside the vocabulary"):
        speculant.generate(t5, encoder_input_ids=[3, 64], max_new_tokens=3)
    with pytest.raises(ValueError, match="max_source_length = 512"):
        speculant.generate(t5, encoder_input_ids=[3] * 513, max_new_tokens=3)


def test_command_line_export_and_a_fresh_process_load(tmp_path):
    """`speculant export DIR OUT` writes a file that a new Python process loads from its path alone and
    decodes exactly as this process does."""
    model = hf_models.make("llama", seed=5)
    model.save_pretrained(tmp_path / "hf")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = tmp_path / "llama.pt"
    done = subprocess.run([sys.executable, "-m", "speculant", "export", str(tmp_path / "hf"), str(out),
                           "--max-length", "64"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "LlamaForCausalLM" in done.stdout and str(out) in done.stdout
    assert "`torch.jit." not in done.stderr  # issue 51: TorchScript's notices ("`torch.jit.save` is deprecated")
    script = ("import speculant; m = speculant.load(%r); "
              "print(speculant.generate(m, [5, 6, 7], max_new_tokens=12, temperature=0).tokens)" % str(out))
    fresh = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert fresh.returncode == 0, fresh.stderr
    here = speculant.generate(speculant.load(out), [5, 6, 7], max_new_tokens=12, temperature=0).tokens
    assert fresh.stdout.strip() == str(here)
    assert speculant.load(out).max_length == 64


def test_command_line_reports_bad_input(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    (tmp_path / "empty").mkdir()
    hf_models.make("gpt2").save_pretrained(tmp_path / "hf")
    for model_dir, out, message in [
            (tmp_path / "empty", "x.pt", "not a save_pretrained directory"),
            (tmp_path / "none", "x.pt", f"model_or_dir: {tmp_path / 'none'} does not exist"),  # issue 51
            (tmp_path / "hf", str(tmp_path / "x.onnx"), "speculant writes .pt (torchscript) or .pt2 (pt2) files; "),
            (tmp_path / "hf", str(tmp_path / "x"), "ends in 'no suffix'")]:
        done = subprocess.run([sys.executable, "-m", "speculant", "export", str(model_dir), out],
                              capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 2
        assert message in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x.onnx").exists()  # it wrote TorchScript under that name
    done = subprocess.run([sys.executable, "-m", "speculant", "export", str(tmp_path / "hf"), str(tmp_path / "f.pt"),
                           "--features", "0"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2 and "features=(0,) is for .pt2 packages" in done.stderr
    with pytest.raises(ValueError, match=r"format='pt2' writes \.pt2"):
        speculant.export(tmp_path / "hf", tmp_path / "x.pt", format="pt2")


def test_export_leaves_the_model_as_it_was_and_checks_lengths(tmp_path):
    model = hf_models.make("gpt2").train()
    speculant.export(model, tmp_path / "m.pt", max_length=32)
    assert model.training
    with pytest.raises(ValueError, match="max_length must be an integer >= 1 or None, got 8.5"):
        speculant.export(model, tmp_path / "m.pt", max_length=8.5)
