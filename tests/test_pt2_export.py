"""speculant.export.pt2: transformers LMs as AOTInductor packages (.pt2) with a static KV cache.

Each package is loaded in Python (torch._inductor.aoti_load_package, the C++ AOTIModelPackageLoader
underneath) and called as the C++ engine will: model(input_ids int64 [1, k], cache_position int64 [k],
position_ids, mask, source, dest) -> logits float32 [1, k, V] (the tree form; T5's decoder in the chain form
with the encoder's outputs appended); the logits must equal transformers' own full-sequence forward after a
prefill, extends, a rollback, a tree call and the move of a kept path. AOTInductor compiles C++
for a few tens of seconds per model on a CPU, so each package is built once per session, with a small cache.
"""
import json
import re

from support import hf_families
import pytest
import torch
import transformers

from torch._inductor.package import load_package

from speculant.export import pt2

from support.hf_families import PT2_MAX_LENGTH, PT2_MAX_SOURCE_LENGTH, random_ids
from support.live_reference import hf_logits

TOLERANCE = 1e-4
DECODERS = ["gpt2", "llama", "qwen2"]


def gpt2_model(**overrides):
    return hf_families.make("gpt2", seed=0, **overrides)


@pytest.fixture(scope="module")
def exported(pt2_zoo):
    """name -> (transformers model, the package loaded in Python), from the session's compiled packages."""
    loaded = {}

    def get(name):
        if name not in loaded:
            model, path = pt2_zoo(name)
            loaded[name] = model, torch._inductor.aoti_load_package(str(path))
        return loaded[name]

    return get


NO_MOVE = torch.zeros(1, dtype=torch.long)  # the tree form's moves: slot 0 to itself


def run(package, ids, start, *encoded):  # ids [1, k] at positions start .. start + k - 1 -> logits [1, k, V]
    slots = torch.arange(start, start + ids.shape[1])
    metadata = package.get_metadata()
    if metadata["tree_calls"] == "1":  # a chain call of the tree form: causal over the slots
        mask = slots.unsqueeze(1) >= torch.arange(int(metadata["max_length"])).unsqueeze(0)
        return package(ids, slots, slots, mask, NO_MOVE, NO_MOVE, *encoded)
    return package(ids, slots, *encoded)


def close(got, expected, tolerance=TOLERANCE):
    """Within `tolerance` times the logits' scale (their largest magnitude, at least 1)."""
    assert got.dtype == torch.float32 and got.shape == expected.shape
    scale = max(1.0, expected.abs().max().item())
    torch.testing.assert_close(got, expected.float(), rtol=0, atol=tolerance * scale)


@pytest.mark.parametrize("name", DECODERS)
@pytest.mark.parametrize("length", [1, 5, 17])
def test_prefill(exported, name, length):
    model, package = exported(name)
    ids = random_ids(length)
    close(run(package, ids, 0), hf_logits(model, ids))


@pytest.mark.parametrize("name", DECODERS)
def test_extend(exported, name):
    model, package = exported(name)
    ids = random_ids(10)
    expected = hf_logits(model, ids)
    run(package, ids[:, :6], 0)
    close(run(package, ids[:, 6:9], 6), expected[:, 6:9])   # 3 tokens
    close(run(package, ids[:, 9:10], 9), expected[:, 9:10])  # 1 token


@pytest.mark.parametrize("name", DECODERS)
def test_rollback(exported, name):
    model, package = exported(name)
    old, new = random_ids(6), random_ids(8, seed=2)
    new[:, :3] = old[:, :3]
    run(package, old, 0)
    # positions 3..5 hold stale keys of `old`: a call at start 3 overwrites or masks them
    close(run(package, new[:, 3:], 3), hf_logits(model, new)[:, 3:])


@pytest.mark.parametrize("name", DECODERS)
def test_tree_call_and_moves(exported, name):
    """The tree form: nodes attend to the prefix, their ancestors and themselves at positions by depth; then a
    kept path's entries are moved into place by the next call, which sees them as a plain sequence."""
    model, package = exported(name)
    assert package.get_metadata()["tree_calls"] == "1"
    prefix = random_ids(5)
    run(package, prefix, 0)
    nodes = random_ids(4, seed=3)  # a, then b and c children of a, then d child of b: slots 5 .. 8
    parents, depths = [-1, 0, 0, 1], [0, 1, 1, 2]
    mask = torch.zeros(4, PT2_MAX_LENGTH, dtype=torch.bool)
    mask[:, :5] = True
    for j in range(4):
        up = j
        while up >= 0:
            mask[j, 5 + up] = True
            up = parents[up]
    slots = torch.arange(5, 9)
    logits = package(nodes, slots, 5 + torch.tensor(depths), mask, NO_MOVE, NO_MOVE)
    paths = [[0], [0, 1], [0, 2], [0, 1, 3]]
    for j, path in enumerate(paths):
        ids = torch.cat([prefix, nodes[:, path]], dim=1)
        close(logits[:, j], hf_logits(model, ids)[:, -1])
    # keep a, b, d: d's entry moves from slot 8 to slot 7 within the next call, a token x at slot 8
    x = random_ids(1, seed=4)
    got = package(x, torch.tensor([8]), torch.tensor([8]), torch.arange(PT2_MAX_LENGTH).unsqueeze(0) <= 8,
                  torch.tensor([8]), torch.tensor([7]))
    close(got, hf_logits(model, torch.cat([prefix, nodes[:, [0, 1, 3]], x], dim=1))[:, -1:])


@pytest.mark.parametrize("name", DECODERS)
def test_metadata(exported, name):
    model, package = exported(name)
    metadata = package.get_metadata()
    assert json.loads(metadata[pt2.METADATA_KEY])["architecture"] == type(model).__name__
    assert metadata["vocab_size"] == "64" and metadata["max_length"] == str(PT2_MAX_LENGTH)
    assert metadata["torch_version"] == torch.__version__.split("+")[0]
    assert metadata["tree_calls"] == "1"


def test_half_precision_logits_are_float32(tmp_path):
    model = hf_families.make("llama", seed=0).to(torch.bfloat16)
    path = tmp_path / "llama_bf16.pt2"
    pt2.export_pt2(model, path, max_length=16, metadata_json="{}")
    ids = random_ids(7)
    got = run(torch._inductor.aoti_load_package(str(path)), ids, 0)
    close(got, hf_logits(model, ids), tolerance=3e-2)  # bf16 keeps 8 bits: rounding of about 2^-8 per step


class DataDependent(transformers.GPT2LMHeadModel):
    def forward(self, input_ids=None, **kwargs):
        if input_ids.sum() > 100:  # control flow on tensor values: torch.export cannot trace it
            input_ids = input_ids.flip(-1)
        return super().forward(input_ids=input_ids, **kwargs)


def test_untraceable_model_names_the_failing_operation(tmp_path):
    model = DataDependent(gpt2_model().config).eval()
    with pytest.raises(ValueError, match=r"torch.export cannot trace DataDependent: .*data-dependent.*"
                                         r"input_ids\.sum\(\) > 100"):
        pt2.export_pt2(model, tmp_path / "x.pt2", max_length=8, metadata_json="{}")


@pytest.mark.parametrize("kwargs, message", [
    ({"max_length": 0}, "max_length must be an integer >= 1"),
    ({"max_length": 8.0}, "max_length must be an integer >= 1"),
    ({"max_length": 97}, "n_positions = 96"),
    ({"metadata_json": "{x"}, "metadata_json is not valid JSON"),
    ({"out_path": "model.pt"}, "must end in .pt2"),
    ({"train": True}, "training mode"),
    ({"max_source_length": 8}, "only for encoder-decoder"),
])
def test_bad_arguments(tmp_path, kwargs, message):
    model = gpt2_model().train(kwargs.pop("train", False))
    arguments = {"max_length": 8, "metadata_json": "{}", **kwargs}
    out_path = tmp_path / arguments.pop("out_path", "x.pt2")
    with pytest.raises(ValueError, match=message):
        pt2.export_pt2(model, out_path, **arguments)


def test_other_encoder_decoder_is_refused(tmp_path):
    model = transformers.BartForConditionalGeneration(transformers.BartConfig(
        vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)).eval()
    with pytest.raises(ValueError, match="encoder-decoder model other than T5"):
        pt2.export_pt2(model, tmp_path / "x.pt2", metadata_json="{}")


# T5: "encoder" (source [1, S]) -> (hidden [1, S, d], cross-attention keys and values per decoder layer);
# "model" (decoder_ids [1, k], cache_position [k], the tree form's inputs, *encoder outputs) -> logits [1, k, V]


@pytest.fixture(scope="module")
def t5(pt2_zoo):
    model, path = pt2_zoo("t5")
    return model, load_package(str(path), "encoder"), load_package(str(path), "model")


@pytest.mark.parametrize("source_length", [1, 7, 24])
def test_t5_decoder_with_cache(t5, source_length):
    model, encoder, decoder = t5
    source = random_ids(source_length, seed=3)
    encoded = encoder(source)
    assert len(encoded) == 1 + 2 * 2 and encoded[1].shape == (1, 4, source_length, 12)  # 2 decoder layers
    ids = random_ids(12)
    with torch.no_grad():
        expected = model(input_ids=source, decoder_input_ids=ids).logits
    assert decoder.get_metadata()["tree_calls"] == "1"
    for length in (1, 5):
        close(run(decoder, ids[:, :length], 0, *encoded), expected[:, :length])
    run(decoder, ids[:, :6], 0, *encoded)
    close(run(decoder, ids[:, 6:9], 6, *encoded), expected[:, 6:9])
    close(run(decoder, ids[:, 9:10], 9, *encoded), expected[:, 9:10])
    new = random_ids(12, seed=4)
    new[:, :3] = ids[:, :3]
    with torch.no_grad():
        expected = model(input_ids=source, decoder_input_ids=new).logits
    close(run(decoder, new[:, 3:], 3, *encoded), expected[:, 3:])  # rollback to 3


def test_t5_metadata(t5):
    _, encoder, decoder = t5
    for package in (encoder, decoder):
        metadata = package.get_metadata()
        assert json.loads(metadata[pt2.METADATA_KEY])["architecture"] == "T5ForConditionalGeneration"
        assert (metadata["vocab_size"], metadata["max_length"], metadata["max_source_length"]) == (
            "64", str(PT2_MAX_LENGTH), str(PT2_MAX_SOURCE_LENGTH))


def test_packages_are_built_with_their_own_copies_of_inline_code(pt2_zoo, tmp_path, monkeypatch):
    """export_pt2 compiles with speculant.export.compiler's wrapper of GCC: the package's library has no GNU
    unique symbols (-fno-gnu-unique: its inline code's statics are its own) and is linked -Bsymbolic; a compiler
    other than GCC is used as Inductor finds it."""
    import shutil
    import subprocess
    import zipfile
    from pathlib import Path

    from speculant.export import compiler

    if not (shutil.which("nm") and shutil.which("readelf")):
        pytest.skip("needs binutils (nm, readelf)")
    _, path = pt2_zoo("gpt2")
    with zipfile.ZipFile(path) as archive:
        (library,) = [name for name in archive.namelist() if name.endswith(".so") and "/aotinductor/" in name]
        library = archive.extract(library, tmp_path)
    symbols = subprocess.run(["nm", "-D", "--defined-only", library], capture_output=True, text=True).stdout
    assert symbols and not [line for line in symbols.splitlines() if line.split()[1:2] == ["u"]]
    assert "SYMBOLIC" in subprocess.run(["readelf", "-d", library], capture_output=True, text=True).stdout
    wrapper = compiler.inductor_options()["cpp.cxx"][1]
    assert "-fno-gnu-unique" in Path(wrapper).read_text()
    assert Path(wrapper) == compiler.bound_locally(shutil.which("g++"))
    clang = tmp_path / "clang++"
    clang.write_text("#!/bin/sh\necho 'Debian clang version 14.0.6'\n")
    clang.chmod(0o755)
    from torch._inductor import cpp_builder
    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", lambda *args: str(clang))
    assert compiler.inductor_options() == {}


def test_the_load_check_passes_where_torch_loads_packages():
    """benchmarks/pt2_load_check.py (torch alone: a CPU nn.Linear package loaded in a process of its own, and its
    compiled library run without the package loader) says yes to both where torch loads packages, as here, so
    that where it says no (benchmarks/gpu.sh runs it beside the .pt2 tests on a GPU machine) the fault is torch's
    on that image, and which of the two routes fails tells where."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parent.parent / "benchmarks" / "pt2_load_check.py"
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "package: a CPU AOTInductor package loads and runs" in result.stdout
    assert "library: a CPU AOTInductor library loads and runs" in result.stdout  # the package's .so alone
    # built again with its own copies of inline code bound locally (the image's crash is in std::regex's)
    for route in ("package", "library"):
        assert f"bound locally (-fno-gnu-unique -Wl,-Bsymbolic), {route}: a CPU AOTInductor {route} loads and runs" \
            in result.stdout
    assert "bound locally: the library's dynamic section says SYMBOLIC" in result.stdout
    assert re.search(r"^bound locally: the \d+ std::regex symbols the library defines all bind to its own copies",
                     result.stdout, re.M)
    assert re.search(r"^default: .*std::regex symbols", result.stdout, re.M)  # where the default library binds them


def test_command_line_says_what_it_compiles_and_nothing_of_torchs(tmp_path):
    """Issue 51: `speculant export MODEL out.pt2` compiled for minutes without a word, after torch's "No CUDA runtime
    is found" on a CPU machine (no news there). It now says what it is doing up front, and only that."""
    import os
    import subprocess
    import sys

    gpt2_model(n_layer=1).save_pretrained(tmp_path / "hf")
    out = tmp_path / "gpt2.pt2"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-m", "speculant", "export", str(tmp_path / "hf"), str(out),
                           "--max-length", "32"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert f"speculant export: {tmp_path / 'hf'} -> {out}: torch.export, then AOTInductor compiles C++" in done.stderr
    assert "No CUDA runtime" not in done.stderr and "`torch.jit." not in done.stderr
    assert out.is_file() and "GPT2LMHeadModel" in done.stdout
