"""The API a transformers user reaches for: prompts in every form a tokenizer gives, per-call sampling
settings, a default gamma, device / dtype at load, and errors that name the fix."""

import json

import numpy as np
import pytest
import torch
import transformers

from support import hf_families
import speculant

PROMPT = [1, 5, 9]


@pytest.fixture(scope="module")
def pair():
    model = hf_families.make("llama", seed=10)
    return model, hf_families.drafted(model, noise=4 * hf_families.NOISE["llama"], seed=11)


class Words:
    """A tokenizer: encode(str) -> ids, decode(ids) -> str, over "t0 t1 ..." words."""

    def encode(self, text):
        return [int(word[1:]) for word in text.split()]

    def decode(self, ids):
        return " ".join(f"t{i}" for i in ids)


def test_prompt_forms_give_the_same_tokens(pair):
    model, draft = pair
    decoder = speculant.SpeculativeDecoder(model, draft, temperature=0)
    assert decoder.gamma == speculant.decoder.DEFAULT_GAMMA == 4
    expected = decoder.generate(PROMPT, max_new_tokens=8).tokens
    forms = [torch.tensor(PROMPT), torch.tensor([PROMPT]), np.array(PROMPT), np.array([PROMPT]),
             transformers.BatchEncoding({"input_ids": [PROMPT], "attention_mask": [[1, 1, 1]]})]
    for form in forms:
        assert decoder.generate(form, max_new_tokens=8).tokens == expected
    assert decoder.generate(input_ids=torch.tensor([PROMPT]), max_new_tokens=8).tokens == expected
    result = decoder.generate("t1 t5 t9", tokenizer=Words(), max_new_tokens=8)
    assert result.tokens == expected and result.text == Words().decode(expected)
    assert speculant.generate(model, input_ids=np.array(PROMPT), max_new_tokens=3, temperature=0).tokens == \
        speculant.generate(model, PROMPT, max_new_tokens=3, temperature=0).tokens


def test_max_length_counts_the_prompt_as_in_transformers(pair):
    """Issue 51: generate(max_length=20), a transformers habit, was a TypeError. It counts the prompt (a batch's
    longest), as transformers' does, and matches transformers' greedy generate."""
    model, draft = pair
    decoder = speculant.SpeculativeDecoder(model, draft, temperature=0)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        want = model.generate(ids, attention_mask=torch.ones_like(ids), max_length=12, do_sample=False,
                              eos_token_id=None, pad_token_id=0, num_beams=1, top_k=None, top_p=None,
                              temperature=None)[0, 3:].tolist()
    assert len(want) == 9
    assert decoder.generate(PROMPT, max_length=12).tokens == want
    assert speculant.generate(model, PROMPT, max_length=12, temperature=0).tokens == want
    rows = decoder.generate([PROMPT, PROMPT[:1]], max_length=12, eos_token_id=None)
    assert [len(r.tokens) for r in rows] == [9, 9]
    for kwargs, message in [
            ({}, r"max_new_tokens is required.*max_length="),
            (dict(max_new_tokens=4, max_length=12), "pass max_new_tokens or max_length, not both"),
            (dict(max_length=2), r"max_length counts the prompt, as in transformers: it must be at least the "
                                 r"prompt's length 3 \+ 0, got 2"),
            (dict(max_length=True), "max_length must be an integer >= 1")]:
        with pytest.raises(ValueError, match=message):
            decoder.generate(PROMPT, **kwargs)
        with pytest.raises(ValueError, match=message):
            speculant.generate(model, PROMPT, **kwargs)


def test_prompt_errors_name_the_fix(pair):
    model, draft = pair
    decoder = speculant.SpeculativeDecoder(model, draft)
    with pytest.raises(ValueError, match="prompt_ids is a string: pass tokenizer="):
        decoder.generate("t1 t5", max_new_tokens=2)
    with pytest.raises(ValueError, match="only left or right padding"):
        decoder.generate({"input_ids": [[0, 1, 5]], "attention_mask": [[1, 0, 1]]}, max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt_ids or input_ids .*not both"):
        decoder.generate(PROMPT, input_ids=PROMPT, max_new_tokens=2)


def test_prompts_nested_deeper_than_a_batch_are_refused_alike(pair):
    """A new user's issue: a 3-level nested list was taken as a batch (each row's extra level read as a batch of
    one) while the same ids as a 3-D tensor were refused. Nothing gives such nesting a meaning of its own, so lists,
    tensors and arrays are refused alike, with one message naming prompt_ids and the forms it takes; a level less
    is what it always was (one prompt, or a batch)."""
    model, draft = pair
    decoder = speculant.SpeculativeDecoder(model, draft, temperature=0)
    forms = (r": pass one prompt \(token ids as a list, a 1-D or \[1, T\] tensor or array\) or a batch \(a list of "
             r"1-D prompts, or a \[B, T\] tensor or array\)$")
    for given, what in [
            ([[PROMPT]], r"prompt_ids\[0\] is a list of sequences"),
            (torch.tensor([[PROMPT]]), r"a 3-D tensor of shape \[1, 1, 3\]"),
            (np.array([[PROMPT]]), r"a 3-D array of shape \[1, 1, 3\]"),
            ([[PROMPT], [PROMPT[:2]]], r"prompt_ids\[0\] is a list of sequences"),
            (torch.tensor([[PROMPT], [PROMPT]]), r"a 3-D tensor of shape \[2, 1, 3\]"),
            ([[PROMPT, PROMPT]], r"prompt_ids\[0\] is a list of sequences"),  # a batch inside a list
            ([PROMPT, (PROMPT, PROMPT)], r"prompt_ids\[1\] is a tuple of sequences"),
            ([torch.tensor(PROMPT), torch.tensor([PROMPT[:2]])], r"prompt_ids\[1\] is a 2-D tensor of shape \[1, 2\]"),
            ({"input_ids": torch.tensor([[PROMPT]])}, r"a 3-D tensor of shape \[1, 1, 3\]")]:
        for generate in (decoder.generate, lambda ids, **kwargs: speculant.generate(model, ids, **kwargs)):
            with pytest.raises(ValueError, match=rf"^prompt_ids nests deeper than a batch \({what}\){forms}"):
                generate(given, max_new_tokens=2)
    with pytest.raises(ValueError, match=r"^encoder_input_ids nests deeper than a batch \(a 3-D tensor"):
        decoder.generate(PROMPT, encoder_input_ids=torch.tensor([[PROMPT]]), max_new_tokens=2)
    alone = decoder.generate(PROMPT, max_new_tokens=2).tokens
    assert decoder.generate([PROMPT], max_new_tokens=2).tokens == alone
    assert [r.tokens for r in decoder.generate([PROMPT, torch.tensor(PROMPT)], max_new_tokens=2)] == [alone, alone]


def test_padded_batch_without_attention_mask_is_refused(pair):
    """Issue 25: a padded [B, T] batch without its attention_mask was decoded with its padding as prompt tokens.
    A batch of equal-length rows where some rows, not all, begin or end with the pad id (the target's: 0 here;
    a tokenizer's pad_token_id first) is refused naming both fixes, which then give each prompt's own tokens."""
    model, draft = pair
    decoder = speculant.SpeculativeDecoder(model, draft, gamma=2, temperature=0)
    right = torch.tensor([[1, 5, 9, 7], [1, 6, 0, 0]])  # row 1 right-padded with the pad id 0
    left = torch.tensor([[1, 5, 9, 7], [0, 0, 1, 6]])
    fix = r"Pass the batch's attention_mask .* or the prompts unpadded as a list of lists"
    for ids, side in ((right, "ends"), (left, "begins")):
        for form in (ids, ids.numpy(), {"input_ids": ids}, transformers.BatchEncoding({"input_ids": ids.tolist()})):
            with pytest.raises(ValueError, match=rf"prompt_ids is a \[2, 4\] batch without attention_mask, and "
                                                 rf"row 1 {side} with the pad id 0 while row 0 does not: it looks "
                                                 rf"padded.*{fix}"):
                decoder.generate(form, max_new_tokens=3)
        with pytest.raises(ValueError, match=r"prompt_ids is a \[2, 4\] batch without attention_mask"):
            speculant.generate(model, input_ids=ids, max_new_tokens=3, temperature=0)
    expected = [decoder.generate(p, max_new_tokens=3).tokens for p in ([1, 5, 9, 7], [1, 6])]
    mask = (right != 0).long()
    assert [r.tokens for r in decoder.generate(right, attention_mask=mask, max_new_tokens=3)] == expected
    assert [r.tokens for r in decoder.generate([[1, 5, 9, 7], [1, 6]], max_new_tokens=3)] == expected
    # a tokenizer's pad id comes first: with pad 7 the batch [[1, 5, 9, 7], [1, 6, 3, 3]] looks right-padded
    tokenizer = Words()
    tokenizer.pad_token_id = 7
    with pytest.raises(ValueError, match="row 0 ends with the pad id 7 while row 1 does not"):
        decoder.generate(torch.tensor([[1, 5, 9, 7], [1, 6, 3, 3]]), tokenizer=tokenizer, max_new_tokens=3)
    # not padding: every row begins with the pad id (a BOS or decoder start equal to it), a row of pad ids only
    # in a batch of different lengths, an all-1s mask that says no row is padded, one row
    for ids in (torch.tensor([[0, 5, 9], [0, 6, 3]]), [[1, 5, 9, 0], [1, 6]], [[1, 6, 0]]):
        assert decoder.generate(ids, max_new_tokens=2) is not None
    unpadded = [r.tokens for r in decoder.generate(right, attention_mask=torch.ones_like(right), max_new_tokens=3)]
    assert unpadded[1] == decoder.generate([1, 6, 0, 0], max_new_tokens=3).tokens


def test_padded_sources_without_attention_mask_are_refused():
    t5 = hf_families.make("t5", seed=0)
    decoder = speculant.SpeculativeDecoder(t5, hf_families.drafted(t5, noise=1e-4, seed=1), gamma=2, temperature=0)
    sources = torch.tensor([[4, 8, 15, 2], [4, 8, 2, 0]])  # T5 pads on the right with 0
    with pytest.raises(ValueError, match=r"encoder_input_ids is a \[2, 4\] batch without attention_mask, and row 1 "
                                         r"ends with the pad id 0"):
        decoder.generate(encoder_input_ids=sources, max_new_tokens=2)
    got = decoder.generate(encoder_input_ids=sources, attention_mask=(sources != 0).long(), max_new_tokens=2)
    assert [r.tokens for r in got] == [decoder.generate(encoder_input_ids=s, max_new_tokens=2).tokens
                                       for s in ([4, 8, 15, 2], [4, 8, 2])]


def test_sampling_settings_per_call(pair):
    model, draft = pair
    sampled = speculant.SpeculativeDecoder(model, draft, gamma=3, temperature=1.0)
    greedy = speculant.SpeculativeDecoder(model, draft, gamma=3, temperature=0)
    top50 = speculant.SpeculativeDecoder(model, draft, gamma=3, temperature=0.7, top_k=50)
    assert sampled.generate(PROMPT, max_new_tokens=12, do_sample=False).tokens == \
        greedy.generate(PROMPT, max_new_tokens=12).tokens
    for seed in range(3):
        assert greedy.generate(PROMPT, max_new_tokens=12, do_sample=True, temperature=0.7, top_k=50,
                               seed=seed).tokens == top50.generate(PROMPT, max_new_tokens=12, seed=seed).tokens
    # do_sample=True on an argmax decoder samples at temperature 1, as transformers does
    assert greedy.generate(PROMPT, max_new_tokens=12, do_sample=True, seed=4).tokens == \
        sampled.generate(PROMPT, max_new_tokens=12, seed=4).tokens
    with pytest.raises(ValueError, match="do_sample=True with temperature=0"):
        greedy.generate(PROMPT, max_new_tokens=2, do_sample=True, temperature=0)
    with pytest.raises(ValueError, match="top_p must be in"):
        greedy.generate(PROMPT, max_new_tokens=2, top_p=1.5)
    assert speculant.generate(model, PROMPT, max_new_tokens=6, do_sample=False).tokens == \
        greedy.generate(PROMPT, max_new_tokens=6).tokens


def test_dtype_and_device_at_load(pair, tmp_path):
    model, _ = pair
    model.save_pretrained(tmp_path / "llama")
    loaded = speculant.load(tmp_path / "llama", dtype="bfloat16", device="cpu")
    assert loaded.module.dtype == torch.bfloat16 and loaded.metadata["dtype"] == "bfloat16"
    with pytest.raises(ValueError, match="dtype must be a floating-point torch.dtype"):
        speculant.load(tmp_path / "llama", dtype="int8")
    with pytest.raises(ValueError, match="device must be a torch device"):
        speculant.load(tmp_path / "llama", device="gpu0")
    decoder = speculant.SpeculativeDecoder(tmp_path / "llama", tmp_path / "llama", dtype=torch.bfloat16)
    assert decoder.target.module.dtype == torch.bfloat16


def test_files_that_are_not_models_name_the_fix(pair, tmp_path):
    model, _ = pair
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    with pytest.raises(ValueError, match="weights.pt was written by torch.save .* export the model first"):
        speculant.load(tmp_path / "weights.pt")
    model.save_pretrained(tmp_path / "hf")  # writes model.safetensors
    with pytest.raises(ValueError, match="model.safetensors is a safetensors file.*export the model first"):
        speculant.load(tmp_path / "hf" / "model.safetensors")
    (tmp_path / "exports").mkdir()
    speculant.export(hf_families.make("gpt2"), tmp_path / "exports" / "gpt2.pt")
    with pytest.raises(ValueError, match="is a directory; pass one of its model files: gpt2.pt"):
        speculant.load(tmp_path / "exports")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ValueError, match=r"notes.txt is neither a TorchScript file \(.pt\), an AOTInductor package \(.pt2\) nor a save_pretrained"):
        speculant.load(tmp_path / "notes.txt")
    with pytest.raises(ValueError, match=r"plain Linear \(torch.nn.Module\) .*speculant.export"):
        speculant.load(torch.nn.Linear(2, 2))
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        speculant.load(tmp_path / "missing.pt")
    assert json.loads(json.dumps(speculant.load(tmp_path / "exports" / "gpt2.pt").metadata))["vocab_size"] == 64


@pytest.mark.parametrize("cut", ["half", "header", "length"])
def test_truncated_safetensors_names_the_file(pair, tmp_path, cut):
    """Issue 25: a save_pretrained directory whose weights were cut short raised safetensors' SafetensorError,
    which names no file; load and export (both formats) raise ValueError naming it."""
    model, _ = pair
    model.save_pretrained(tmp_path / "hf")
    weights = tmp_path / "hf" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:{"half": len(data) // 2, "header": 100, "length": 5}[cut]])
    message = r"model: .*hf/model\.safetensors is truncated: .*copy or save the model again"
    with pytest.raises(ValueError, match=message):
        speculant.load(tmp_path / "hf")
    with pytest.raises(ValueError, match=message):
        speculant.SpeculativeDecoder(tmp_path / "hf", model)
    for out in ("x.pt", "x.pt2"):
        with pytest.raises(ValueError, match=message):
            speculant.export(tmp_path / "hf", tmp_path / out)


def test_damaged_shard_is_named(pair, tmp_path):
    model, _ = pair
    model.save_pretrained(tmp_path / "hf", max_shard_size="100KB")
    shards = sorted((tmp_path / "hf").glob("*.safetensors"))
    assert len(shards) >= 2
    shards[1].write_bytes(shards[1].read_bytes() + b"\0" * 16)  # longer than its tensors: corrupt
    with pytest.raises(ValueError, match=rf"{shards[1].name} is corrupt: \d+ bytes, its tensors cover \d+"):
        speculant.load(tmp_path / "hf")
    shards[1].write_bytes(shards[1].read_bytes()[:-1000])
    with pytest.raises(ValueError, match=rf"{shards[1].name} is truncated: \d+ bytes, its tensors need \d+"):
        speculant.load(tmp_path / "hf")


@pytest.mark.parametrize("suffix", [".pt", ".pt2"])
def test_export_in_half_precision(tmp_path, suffix):
    model = hf_families.make("llama", seed=10)
    meta = speculant.export(model, tmp_path / f"llama{suffix}", dtype="bfloat16", max_length=32)
    assert meta["dtype"] == "bfloat16" and model.dtype == torch.float32  # the caller's model is not converted
    loaded = speculant.load(tmp_path / f"llama{suffix}")
    half = model.to(torch.bfloat16)
    expected = half.generate(input_ids=torch.tensor([PROMPT]), do_sample=False, max_new_tokens=1,
                             eos_token_id=None, pad_token_id=0)[0, -1].item()
    assert speculant.generate(loaded, PROMPT, max_new_tokens=1, temperature=0).tokens == [expected]
    assert len(speculant.generate(loaded, PROMPT, max_new_tokens=8, seed=0).tokens) == 8
