"""Damaged and foreign files: a truncated, corrupted or foreign .pt / .pt2 / drafter file raises a ValueError that
names the file and says what is wrong (never a crash, never a silently wrong model), and the weights-only route for
untrusted sources (docs/untrusted-files.md): a save_pretrained directory of safetensors + config, loaded
by speculant.load through transformers or exported locally, works as described.

Traced transformers models (docs/loading-models.md, "Coming from transformers' TorchScript tutorial"): a GPT-2 traced
by torch.jit.trace with use_cache=False and strict=False returns a dict holding its logits; speculant.load takes the
module or its saved file, says once that it took the logits and that the plain form recomputes the prefix, and greedy
decoding gives transformers' greedy generate. A tuple holding the logits first is taken too; a forward returning
anything else is refused with what it returned and the fixes; every plain-form load warns once, a cached one never.
"""

import re
import warnings
import zipfile
from typing import Any, Dict

import pytest
import torch

from support import hf_families
from support import hf_models
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


PLAIN = r"is in the plain form \(forward only\), which recomputes the whole prefix at every call; speculant\.export"


def user_warnings(said) -> list:
    """The UserWarnings pytest.warns recorded (it records TorchScript's deprecation notices too)."""
    return [w for w in said if issubclass(w.category, UserWarning)]


def traced(module, example: torch.Tensor, **options) -> torch.jit.ScriptModule:
    """torch.jit.trace without its notes (TracerWarnings on Python values it freezes; transformers' deprecation of an
    attribute the tracer reads), as docs/loading-models.md does."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated")
        return torch.jit.trace(module, example, **options)


def test_a_traced_transformers_model_decodes_as_transformers_does(tmp_path):
    model = hf_models.make("gpt2", seed=10, use_cache=False)
    module = traced(model, torch.tensor([hf_models.PROMPTS[2]]), strict=False)  # forward -> {"logits": ...}
    torch.jit.save(module, tmp_path / "traced.pt")
    taken = r"\(its forward returns a dict: speculant takes its 'logits'\) " + PLAIN
    for given in (module, tmp_path / "traced.pt"):
        with pytest.warns(UserWarning, match=taken) as said:
            loaded = speculant.load(given)
        assert len(user_warnings(said)) == 1 and loaded.form == "plain" and loaded.vocab_size == hf_models.VOCAB
        for index in range(len(hf_models.PROMPTS)):
            expected = hf_models.hf_greedy(model, "gpt2", index, eos=None)
            result = speculant.generate(loaded, hf_models.PROMPTS[index], max_new_tokens=hf_models.MAX_NEW,
                                        temperature=0)
            assert result.tokens == expected, (given, index)


class _Pair(torch.nn.Module):
    """A causal LM's forward returning (logits, hidden states), as transformers' tuple outputs put them."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        out = self.model(input_ids, output_hidden_states=True)
        return out.logits, out.hidden_states[-1]


class _Returns(torch.nn.Module):
    """A forward returning `kind` of output: no logits in it."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def forward(self, input_ids):
        ones = torch.ones(1, input_ids.shape[1], 4)
        if self.kind == "dict":
            return {"hidden": ones}
        if self.kind == "tuple":
            return (ones[0], ones)
        return ones[0]  # [T, 4]: no batch axis


def test_a_tuple_with_the_logits_first_is_taken():
    model = hf_models.make("gpt2", seed=10, use_cache=False)
    module = traced(_Pair(model), torch.tensor([[1, 2, 3]]))
    with pytest.warns(UserWarning, match=r"returns a tuple: speculant takes its first element, the logits\) "
                      + PLAIN):
        loaded = speculant.load(module)
    assert speculant.generate(loaded, [1, 5, 9], max_new_tokens=8, temperature=0).tokens == hf_models.hf_greedy(
        model, "gpt2", 0, eos=None)[:8]


@pytest.mark.parametrize("kind, got", [
    ("dict", r"got a dict of 1 \('hidden': a torch.float32 Tensor of shape \[1, 1, 4\]\)"),
    ("tuple", r"got a tuple of 2 \(a torch.float32 Tensor of shape \[1, 4\], a torch.float32 Tensor of shape "
              r"\[1, 1, 4\]\)"),
    ("tensor", r"got a torch.float32 Tensor of shape \[1, 4\]"),
])
def test_a_forward_without_logits_is_refused_naming_what_it_returned(kind, got, tmp_path):
    module = traced(_Returns(kind), torch.tensor([[1, 2, 3]]), strict=False)
    torch.jit.save(module, tmp_path / "returns.pt")
    fixes = (r"speculant\.export\(model, 'model\.pt'\).*a wrapper module whose forward returns "
             r"model\(input_ids\)\.logits")
    for given in (module, tmp_path / "returns.pt"):
        with pytest.raises(ValueError, match=r"forward\(input_ids\[1, T\]\) must return logits \[1, T, V\] .*"
                           + got + ".*" + fixes):
            speculant.load(given)


class _Mixed(torch.nn.Module):
    """A scripted forward returning its logits in a dict of mixed values (Dict[str, Any])."""

    def forward(self, input_ids: torch.Tensor) -> Dict[str, Any]:
        out: Dict[str, Any] = {"logits": torch.zeros(1, input_ids.shape[1], 4), "count": 3}
        return out


def test_logits_the_output_type_does_not_make_a_tensor_are_refused():
    with pytest.raises(ValueError, match=r"its forward returns Dict\[str, Any\], whose logits are not typed as a "
                       r"Tensor, so speculant cannot take them .*speculant\.export\(model, 'model\.pt'\)"):
        speculant.load(torch.jit.script(_Mixed()))


def test_every_plain_form_load_warns_once_and_the_cached_form_never(tmp_path):
    gpt = tiny_gpt.TinyGPT(tiny_gpt.TinyGPTConfig(vocab_size=16, n_layer=1, n_head=2, d_model=8, max_length=16))
    plain = tiny_gpt.script_plain(gpt)
    plain.save(str(tmp_path / "plain.pt"))
    for given in (plain, tmp_path / "plain.pt", tmp_path / "plain.pt"):
        with pytest.warns(UserWarning, match=r"model .+ " + PLAIN) as said:
            assert speculant.load(given).form == "plain"
        assert [w.filename for w in user_warnings(said)] == [__file__]  # once, pointed at the caller
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        assert speculant.load(tiny_gpt.script_cached(gpt)).form == "cached"
