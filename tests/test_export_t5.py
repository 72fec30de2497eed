"""speculant.export.t5 against Hugging Face's T5ForConditionalGeneration (small random models, no downloads).

Every comparison is HF's logits for (input_ids, decoder_input_ids) in one stateless call against the scripted
module's encode / prefill / extend / truncate path, max abs difference <= 1e-4 in float32.
"""
import pytest
import torch
from torch import nn

pytest.importorskip("transformers")
from transformers import T5Config, T5ForConditionalGeneration  # noqa: E402
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402

from speculant.export import t5  # noqa: E402
from support.hf_families import random_ids  # noqa: E402
from support.live_reference import hf_logits  # noqa: E402

ATOL = 1e-4

# Original T5 (relu, tied embeddings, output rescaled by d_model**-0.5, eager attention as the reference) with
# more decoder than encoder layers and few buckets / a short max_distance so that long decoders reach the
# log-spaced and the last buckets; T5 v1.1 (gated-gelu, its own lm_head, no rescale, SDPA reference) with
# H * D = 48 != d_model = 40.
CONFIGS = {
    "t5-relu-tied": dict(
        vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=3, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, feed_forward_proj="relu",
        tie_word_embeddings=True, attn_implementation="eager",
    ),
    "t5v1.1-gated-gelu-untied": dict(
        vocab_size=80, d_model=40, d_kv=16, d_ff=56, num_layers=3, num_heads=3, layer_norm_epsilon=1e-5,
        feed_forward_proj="gated-gelu", tie_word_embeddings=False, attn_implementation="sdpa",
    ),
}


def build(seed: int = 0, untie: bool = False, **fields) -> T5ForConditionalGeneration:
    torch.manual_seed(seed)
    model = T5ForConditionalGeneration(T5Config(decoder_start_token_id=0, **fields)).eval()
    with torch.no_grad():  # away from the init's all-ones norms and small position biases, so both matter
        for name, p in model.named_parameters():
            if name.endswith("layer_norm.weight"):
                p.add_(torch.randn_like(p), alpha=0.2)
            elif name.endswith("relative_attention_bias.weight"):
                p.normal_(0.0, 1.0)
    if untie:  # transformers 5 ties lm_head to `shared` whatever the config says: give it its own weights
        model.lm_head.weight = nn.Parameter(torch.randn_like(model.shared.weight) * fields["d_model"] ** -0.5)
    return model.requires_grad_(False)


@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request):
    fields = CONFIGS[request.param]
    model = build(untie=not fields["tie_word_embeddings"], **fields)
    return model, t5.script(model, max_length=48, max_source_length=16)


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    diff = (actual - expected).abs().max().item()
    assert diff <= ATOL, f"max abs diff {diff:.3g} > {ATOL}"


def test_reference_is_not_trivial(pair):
    model, _ = pair
    V = model.config.vocab_size
    logits = hf_logits(model, random_ids(9, V, 2), random_ids(9, V, 1))
    assert logits.std(-1).min() > 0.5  # agreement below would mean little on near-constant logits


def test_contract_attributes(pair):
    model, scripted = pair
    assert scripted.vocab_size == model.config.vocab_size
    assert (scripted.max_length, scripted.max_source_length, scripted.decoder_start_token_id) == (48, 16, 0)
    hf = {p.data_ptr() for p in model.parameters()}
    for name, p in scripted.named_parameters():
        assert not p.requires_grad, name
        assert p.data_ptr() in hf, f"{name} is not the HF model's tensor"  # shared, not copied
        assert p.dtype == torch.float32 and p.device.type == "cpu"
    lm_head_is_shared = scripted.lm_head.data_ptr() == model.shared.weight.data_ptr()
    assert lm_head_is_shared == (model.lm_head.weight is model.shared.weight)


@pytest.mark.parametrize("S, T", [(1, 1), (5, 3), (16, 9), (3, 30)])
def test_stateless_forward(pair, S, T):
    model, scripted = pair
    V = model.config.vocab_size
    src, dec = random_ids(S, V, S), random_ids(T, V, 100 + T)
    close(scripted(src, dec), hf_logits(model, dec, src))


@pytest.mark.parametrize("T", [1, 3, 9])
def test_prefill(pair, T):
    model, scripted = pair
    V = model.config.vocab_size
    src, dec = random_ids(7, V, 1), random_ids(T, V, 2)
    scripted.encode(src)
    assert scripted.cache_length() == 0
    close(scripted.prefill(dec), hf_logits(model, dec, src))
    assert scripted.cache_length() == T


def test_extend_steps_of_one_and_three(pair):
    model, scripted = pair
    V = model.config.vocab_size
    src, dec = random_ids(11, V, 3), random_ids(24, V, 4)
    expected = hf_logits(model, dec, src)  # [1, 24, V]
    scripted.encode(src)
    close(scripted.prefill(dec[:, :2]), expected[:, :2])
    t = 2
    for k in (1, 1, 3, 1, 3, 3, 1, 3, 3, 1, 1, 1):
        close(scripted.extend(dec[:, t:t + k]), expected[:, t:t + k])
        t += k
        assert scripted.cache_length() == t
    assert t == dec.size(1)


def test_truncate_then_extend_other_tokens(pair):
    model, scripted = pair
    V = model.config.vocab_size
    src, dec, other = random_ids(6, V, 5), random_ids(9, V, 6), random_ids(4, V, 7)
    scripted.encode(src)
    scripted.prefill(dec)
    scripted.truncate(4)  # roll back 5 rejected positions
    assert scripted.cache_length() == 4
    rolled = torch.cat([dec[:, :4], other], dim=1)  # [1, 8]
    expected = hf_logits(model, rolled, src)
    close(scripted.extend(other[:, :3]), expected[:, 4:7])
    close(scripted.extend(other[:, 3:]), expected[:, 7:8])
    scripted.truncate(0)
    close(scripted.extend(rolled[:, :2]), expected[:, :2])


def test_second_encode_replaces_the_source(pair):
    model, scripted = pair
    V = model.config.vocab_size
    dec = random_ids(5, V, 8)
    for S in (7, 16, 2):  # longer, then shorter than before: the cross K/V follow the new source
        src = random_ids(S, V, 200 + S)
        scripted.encode(src)
        assert scripted.cache_length() == 0
        expected = hf_logits(model, dec, src)
        close(scripted.prefill(dec[:, :3]), expected[:, :3])
        close(scripted.extend(dec[:, 3:]), expected[:, 3:])


def test_stateless_forward_leaves_the_caches_alone(pair):
    model, scripted = pair
    V = model.config.vocab_size
    src, dec = random_ids(8, V, 9), random_ids(6, V, 10)
    expected = hf_logits(model, dec, src)
    scripted.encode(src)
    scripted.prefill(dec[:, :4])
    scripted(random_ids(12, V, 11), random_ids(10, V, 12))  # another source and decoder, no cache
    assert scripted.cache_length() == 4
    close(scripted.extend(dec[:, 4:]), expected[:, 4:])


@pytest.mark.parametrize("buckets, max_distance", [(8, 16), (32, 128), (7, 10), (4, 5), (12, 7)])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_position_buckets_match_hf(buckets, max_distance, bidirectional):
    relative = torch.arange(-300, 301)[:, None] + torch.arange(-2, 3)[None, :]  # [601, 5], all distances
    ours = t5.relative_position_bucket(relative, bidirectional, buckets, max_distance)
    theirs = T5Attention._relative_position_bucket(
        relative, bidirectional=bidirectional, num_buckets=buckets, max_distance=max_distance
    )
    assert torch.equal(ours, theirs)


def test_long_decoder_reaches_the_far_buckets():
    # decoder length 40 with max_distance 16 and 8 buckets: distances 0..39 cover exact, log-spaced and
    # the shared last bucket; the bias table is large (std 1), so a wrong bucket shows in the logits
    fields = dict(CONFIGS["t5-relu-tied"])
    model = build(seed=1, **fields)
    scripted = t5.script(model, max_length=40, max_source_length=40)
    V = fields["vocab_size"]
    src, dec = random_ids(33, V, 13), random_ids(40, V, 14)
    expected = hf_logits(model, dec, src)
    close(scripted(src, dec), expected)
    scripted.encode(src)
    close(scripted.prefill(dec[:, :17]), expected[:, :17])
    for t in range(17, 40, 3):
        close(scripted.extend(dec[:, t:t + 3]), expected[:, t:t + 3])
    assert scripted.cache_length() == 40


@pytest.mark.parametrize("proj", ["gelu", "gated-silu", "swish", "gated-gelu_pytorch_tanh"])
def test_other_activations(proj):
    model = build(seed=2, vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4,
                  feed_forward_proj=proj)
    scripted = t5.script(model, max_length=8, max_source_length=8)
    src, dec = random_ids(5, 64, 15), random_ids(4, 64, 16)
    expected = hf_logits(model, dec, src)
    scripted.encode(src)
    close(scripted.prefill(dec[:, :3]), expected[:, :3])
    close(scripted.extend(dec[:, 3:]), expected[:, 3:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_keeps_dtype_and_hf_accuracy(dtype):
    # rounding differs (fused GELU, summation order), so the bound is HF's own distance to float32, doubled
    fields = dict(CONFIGS["t5v1.1-gated-gelu-untied"])
    model32 = build(seed=3, untie=True, **fields)
    model = build(seed=3, untie=True, **fields).to(dtype)
    scripted = t5.script(model, max_length=16, max_source_length=16)
    V = fields["vocab_size"]
    src, dec = random_ids(9, V, 17), random_ids(12, V, 18)
    exact = hf_logits(model32, dec, src)
    hf_error = (hf_logits(model, dec, src).float() - exact).abs().max().item()
    scripted.encode(src)
    ours = torch.cat([scripted.prefill(dec[:, :5]), scripted.extend(dec[:, 5:6]), scripted.extend(dec[:, 6:])], 1)
    assert ours.dtype == dtype
    assert (ours.float() - exact).abs().max().item() <= 2 * hf_error


def test_save_load_roundtrip(tmp_path):
    fields = dict(CONFIGS["t5v1.1-gated-gelu-untied"])
    model = build(seed=4, untie=True, **fields)
    scripted = t5.script(model, max_length=12, max_source_length=10)
    path = tmp_path / "t5.pt"
    torch.jit.save(scripted, str(path))
    loaded = torch.jit.load(str(path))
    assert (loaded.vocab_size, loaded.max_length, loaded.max_source_length) == (fields["vocab_size"], 12, 10)
    V = fields["vocab_size"]
    src, dec = random_ids(10, V, 19), random_ids(12, V, 20)
    expected = hf_logits(model, dec, src)
    close(loaded(src, dec), expected)
    loaded.encode(src)
    close(loaded.prefill(dec[:, :1]), expected[:, :1])
    close(loaded.extend(dec[:, 1:4]), expected[:, 1:4])
    loaded.truncate(2)
    close(loaded.extend(dec[:, 2:]), expected[:, 2:])


def test_tree_calls_of_one_row_equal_each_nodes_path(pair):
    """A prefix through extend_rows, then a tree (root c: children d, e; d: child f) through extend_rows_masked,
    nodes in slots after the prefix; each node's logits are HF's for its own path; then copy_slots keeps the path
    c, e (its entries moved to consecutive slots) and a token after it is HF's for the kept sequence. Far
    positions (past the exact buckets) reach the log-spaced relative buckets."""
    model, scripted = pair
    vocab = model.config.vocab_size
    src, prefix = random_ids(9, vocab, 30), random_ids(20, vocab, 31)  # [1, 9], [1, 20]
    c, d, e, f, x = random_ids(5, vocab, 32)[0].tolist()
    scripted.encode(src)
    scripted.start_rows(1)
    row = torch.zeros(1, dtype=torch.long)
    n = prefix.size(1)
    at = torch.arange(n)[None]
    close(scripted.extend_rows(prefix, row, at, at, n), hf_logits(model, prefix, src))
    tree = torch.tensor([[c, d, e, f]])
    positions = torch.tensor([[n, n + 1, n + 1, n + 2]])
    slots = torch.arange(n, n + 4)[None]
    mask = torch.zeros(1, 4, n + 4, dtype=torch.bool)
    mask[0, :, :n] = True
    for node, path in enumerate([[0], [0, 1], [0, 2], [0, 1, 3]]):
        mask[0, node, [n + p for p in path]] = True
    logits = scripted.extend_rows_masked(tree, row, positions, slots, mask)
    for node, path in enumerate([[c], [c, d], [c, e], [c, d, f]]):
        expected = hf_logits(model, torch.cat([prefix, torch.tensor([path])], 1), src)[:, -1]
        close(logits[:, node], expected)
    scripted.copy_slots(row, torch.tensor([[n + 2]]), torch.tensor([[n + 1]]))  # e into the slot after c
    after = scripted.extend_rows(torch.tensor([[x]]), row, torch.tensor([[n + 2]]), torch.tensor([[n + 2]]), n + 3)
    close(after[:, 0], hf_logits(model, torch.cat([prefix, torch.tensor([[c, e, x]])], 1), src)[:, -1])
    with pytest.raises(torch.jit.Error, match="rows share the one encoded source, so batch must be 1, got 2"):
        scripted.start_rows(2)
    two = torch.zeros(2, 1, dtype=torch.long)
    with pytest.raises(torch.jit.Error, match="a T5 module has one row"):
        scripted.extend_rows_masked(two, torch.zeros(2, dtype=torch.long), two, two, torch.ones(2, 1, 3).bool())
    with pytest.raises(torch.jit.Error, match="mask must be bool"):
        scripted.extend_rows_masked(tree[:, :1], row, positions[:, :1], slots[:, :1], mask[:, :1].float())


def test_bad_calls_raise_clear_errors():
    model = build(seed=5, vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4)
    scripted = t5.script(model, max_length=6, max_source_length=5)
    one = torch.zeros(1, 1, dtype=torch.long)
    for call in (scripted.extend, scripted.prefill):
        with pytest.raises(torch.jit.Error, match=r"no source encoded yet, call encode\(input_ids\) first"):
            call(one)
    with pytest.raises(torch.jit.Error, match="6 source positions exceed max_source_length=5"):
        scripted.encode(torch.zeros(1, 6, dtype=torch.long))
    with pytest.raises(torch.jit.Error, match="encode: expected int64 input_ids"):
        scripted.encode(torch.zeros(1, 3, dtype=torch.int32))
    with pytest.raises(torch.jit.Error, match=r"encode: expected input_ids \[1, n\] with n >= 1"):
        scripted.encode(torch.zeros(1, 0, dtype=torch.long))
    src, dec = torch.arange(5)[None], torch.arange(7, 13)[None]  # [1, 5], [1, 6]
    scripted.encode(src)
    scripted.prefill(dec[:, :4])
    with pytest.raises(torch.jit.Error, match=r"extend/prefill: expected input_ids \[1, n\]"):
        scripted.prefill(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(torch.jit.Error, match=r"0 cached \+ 7 new positions exceed max_length=6"):
        scripted.prefill(torch.zeros(1, 7, dtype=torch.long))
    with pytest.raises(torch.jit.Error, match="extend/prefill: expected int64 input_ids"):
        scripted.extend(torch.zeros(1, 1))
    with pytest.raises(torch.jit.Error, match=r"4 cached \+ 3 new positions exceed max_length=6"):
        scripted.extend(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(torch.jit.Error, match=r"truncate: length must be in \[0, cache_length\(\)=4\]"):
        scripted.truncate(5)
    with pytest.raises(torch.jit.Error, match=r"forward \(decoder_input_ids\): expected input_ids \[1, n\]"):
        scripted(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, 1, dtype=torch.long))
    assert scripted.cache_length() == 4  # refused calls change nothing
    close(scripted.extend(dec[:, 4:]), hf_logits(model, dec, src)[:, 4:])


@pytest.mark.parametrize("fields, field", [
    (dict(feed_forward_proj="gated-quick_gelu"), "feed_forward_proj"),
    (dict(feed_forward_proj="relu2"), "feed_forward_proj"),
    (dict(relative_attention_num_buckets=2), "relative_attention_num_buckets"),
    (dict(relative_attention_num_buckets=8, relative_attention_max_distance=4), "relative_attention_max_distance"),
    (dict(is_encoder_decoder=False), "is_encoder_decoder"),
    (dict(layer_norm_epsilon=float("nan")), "layer_norm_epsilon"),
])
def test_unsupported_config_is_refused_by_name(fields, field):
    config = T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4, **fields)
    with pytest.raises(ValueError, match=rf"config\.{field}\b"):
        t5.check_config(config)


def test_script_refuses_what_it_cannot_export():
    model = build(seed=6, vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=4)
    for kwargs, message in ((dict(max_length=0, max_source_length=4), "max_length must be an int >= 1"),
                            (dict(max_length=4, max_source_length=0), "max_source_length must be an int >= 1")):
        with pytest.raises(ValueError, match=message):
            t5.script(model, **kwargs)
    model.config.feed_forward_proj, model.config.dense_act_fn = "tanh", "tanh"
    with pytest.raises(ValueError, match="feed_forward_proj"):
        t5.script(model, max_length=4, max_source_length=4)
    torch.manual_seed(0)
    no_start = T5ForConditionalGeneration(
        T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=1, num_heads=4)
    ).eval()
    with pytest.raises(ValueError, match="decoder_start_token_id is not set"):
        t5.script(no_start, max_length=4, max_source_length=4)
    with pytest.raises(ValueError, match="expected a T5ForConditionalGeneration"):
        t5.script(nn.Linear(2, 2), max_length=4, max_source_length=4)


@pytest.mark.cuda
def test_cuda_matches_hf():
    fields = dict(CONFIGS["t5v1.1-gated-gelu-untied"])
    model = build(seed=7, untie=True, **fields).cuda()
    scripted = t5.script(model, max_length=16, max_source_length=16)
    V = fields["vocab_size"]
    src, dec = random_ids(9, V, 21).cuda(), random_ids(12, V, 22).cuda()
    expected = hf_logits(model, dec, src)
    scripted.encode(src)
    ours = torch.cat([scripted.prefill(dec[:, :5]), scripted.extend(dec[:, 5:6]), scripted.extend(dec[:, 6:])], 1)
    assert ours.device.type == "cuda"
    close(ours, expected)
