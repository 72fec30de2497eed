"""Damaged and foreign files: a truncated, corrupted or foreign .pt / .pt2 / drafter file raises a ValueError that
names the file and says what is wrong (never a crash, never a silently wrong model), and the weights-only route for
untrusted sources (docs/untrusted-files.md): a save_pretrained directory of safetensors + config, loaded
by speculant.load through transformers or exported locally, works as described."""

import re
import zipfile

import pytest
import torch

import hf_families
import speculant
from speculant import drafters, tiny_gpt


def damaged(good, tmp_path):
    """name -> path: the file cut to half its length, with 64 bytes inverted a third of the way in, a text file
    under the same suffix, and zip archives of foreign content (a note; a TorchScript-looking layout of garbage)."""
    data, suffix = good.read_bytes(), good.suffix
    flipped = bytearray(data)
    third = len(data) // 3
    flipped[third:third + 64] = bytes(b ^ 0xFF for b in flipped[third:third + 64])
    out = {"truncated": data[:len(data) // 2], "flipped": bytes(flipped), "text": b"not a model, just text\n"}
    paths = {}
    for name, content in out.items():
        paths[name] = tmp_path / f"{name}{suffix}"
        paths[name].write_bytes(content)
    paths["foreign zip"] = tmp_path / f"foreign{suffix}"
    with zipfile.ZipFile(paths["foreign zip"], "w") as archive:
        archive.writestr("notes/readme.txt", "a zip archive, not a model")
    paths["foreign layout"] = tmp_path / f"layout{suffix}"
    with zipfile.ZipFile(paths["foreign layout"], "w") as archive:
        archive.writestr("archive/code/__torch__.py", "garbage")
        archive.writestr("archive/constants.pkl", "garbage")
    return paths


WHAT = {"truncated": "damaged zip archive, truncated or corrupted", "flipped": "damaged zip archive, truncated or "
        "corrupted", "text": "not a zip archive", "foreign zip": "zip archive but neither a TorchScript file",
        "foreign layout": "not a loadable TorchScript file"}


def check_model_files(good, tmp_path):
    speculant.load(good)  # the original loads
    for name, path in damaged(good, tmp_path).items():
        with pytest.raises(ValueError, match=re.escape(str(path))) as info:
            speculant.load(path)
        assert WHAT[name] in str(info.value), (name, str(info.value))


def test_damaged_torchscript_files(tmp_path):
    torch.manual_seed(0)
    good = tmp_path / "good.pt"
    torch.jit.save(tiny_gpt.script_cached(tiny_gpt.TinyGPT(tiny_gpt.TinyGPTConfig(32, 1, 1, 8, 32))), str(good))
    check_model_files(good, tmp_path)


def test_damaged_pt2_packages(pt2_zoo, tmp_path):
    _, good = pt2_zoo("gpt2")
    check_model_files(good, tmp_path)
    # A well-formed archive whose compiled library is foreign: the loader's error names the file.
    swapped = tmp_path / "swapped.pt2"
    with zipfile.ZipFile(good) as source, zipfile.ZipFile(swapped, "w") as archive:
        for entry in source.infolist():
            archive.writestr(entry, b"\x7fELF not a library" if entry.filename.endswith(".so") else source.read(entry))
    with pytest.raises(ValueError, match=re.escape(f"model {swapped}: AOTInductor could not load")):
        speculant.load(swapped)


@pytest.mark.parametrize("kind", [drafters.Unigram, drafters.Bigram])
def test_damaged_drafter_files(kind, tmp_path):
    good = tmp_path / "good.drafter"
    kind.fit(list(range(32)) * 4, vocab_size=32).save(good)
    kind.load(good)
    what = {"truncated": "not a torch.save archive", "flipped": "damaged drafter file, truncated or corrupted",
            "text": "not a torch.save archive", "foreign zip": "is not a speculant drafter file",
            "foreign layout": "is not a speculant drafter file"}
    for name, path in damaged(good, tmp_path).items():
        with pytest.raises(ValueError, match=re.escape(str(path))) as info:
            kind.load(path)
        assert what[name] in str(info.value), (name, str(info.value))
    # A torch.save file with the right kind and wrong contents: named, with what failed.
    torch.save({"kind": kind.kind, "unigram": torch.zeros(4)}, tmp_path / "wrong.drafter")
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'wrong.drafter'} is not a valid {kind.kind}")):
        kind.load(tmp_path / "wrong.drafter")


def test_weights_only_route_safetensors_and_config(tmp_path):
    """docs/untrusted-files.md's route for untrusted weights: a save_pretrained directory holding only config and safetensors
    (no pickle), loaded by speculant.load (transformers reads the safetensors) and exported locally."""
    model = hf_families.make("llama", seed=3)
    model.save_pretrained(tmp_path / "hf")
    files = sorted(p.name for p in (tmp_path / "hf").iterdir())
    assert "config.json" in files and "model.safetensors" in files
    assert not any(name.endswith((".bin", ".pt", ".pkl", ".py")) for name in files), files
    prompt = [1, 2, 3]
    live = speculant.load(tmp_path / "hf")
    assert live.form == "live"
    expected = speculant.generate(model, prompt, max_new_tokens=8, temperature=0).tokens
    assert speculant.generate(live, prompt, max_new_tokens=8, temperature=0).tokens == expected
    speculant.export(tmp_path / "hf", tmp_path / "local.pt")  # exported here, from the weights alone
    assert speculant.generate(speculant.load(tmp_path / "local.pt"), prompt, max_new_tokens=8,
                              temperature=0).tokens == expected
