"""speculant.testing on table models (tests/support/markov.py) and a small TinyGPT: the exact reference law, a correct
pair passes, lenience and a wrong reference are caught (power), the partition stays small for a larger
vocabulary, and the inputs it accepts."""

import re

import pytest
import torch

from support import markov
import speculant
from speculant import testing
from speculant.tiny_gpt import TinyGPT, TinyGPTConfig, script_plain

# Plain-form models (forward only) are loaded here on purpose: load's warning that the form recomputes the
# prefix at every call is tested in test_files.py.
pytestmark = pytest.mark.filterwarnings("ignore:model .* is in the plain form:UserWarning")

PROMPT = [2, 1, 3]


def pair(seed, **kwargs):
    target, draft = markov.target_and_draft(4, seed, **kwargs)
    return target, markov.cached_model(target), markov.cached_model(draft)


def test_correct_pair_passes_with_the_exact_law():
    table, target, draft = pair(4, mask_prob=0.1)
    check = testing.check_distribution(target, draft, PROMPT, k=2, gamma=3, temperature=0.7, top_k=3,
                                       samples=2000, seed=1)
    assert check.passed and check.impossible == 0 and check.p_value >= 1e-3
    exact = markov.continuation_law(table, PROMPT, 2, 0.7, 3, 1.0)  # [4, 4]
    complete = [(cell, e) for cell, _, e in check.cells if "*" not in cell and cell[0] != "pooled"]
    assert len(complete) >= 5
    for cell, expected in complete:
        assert expected / 2000 == pytest.approx(exact[cell].item(), abs=1e-6)
    assert sum(e for _, _, e in check.cells) == pytest.approx(2000)
    assert sum(o for _, o, _ in check.cells) == 2000
    assert check.dof == len(check.cells) - 1 and "passed" in check.report == str(check)


def test_lenience_is_checked_against_what_it_promises():
    """Issue 51: lenience 0.3 with an unrelated draft changes the law of the first two tokens by design (A.5), and
    the check reported only "FAILED". It now tests A.5's promise (no cell above its target probability / l^k) and
    reports how far the law moved beside it."""
    _, target, draft = pair(21, independent_draft=True, concentration=0.5)
    check = testing.check_distribution(target, draft, PROMPT, k=2, gamma=2, lenience=0.3, samples=2000,
                                       tokenizer=lambda ids: "".join("abcd"[i] for i in ids), progress=False)
    assert check.passed and check.test == "lenience bound", check.report
    report = check.report
    assert "lenience check passed" in report and "changes the output law by design (Appendix A.5)" in report
    assert "lenience=0.3" in report and re.search(r"\n      +\d+ +[\d.]+ +[\d.]+  \[(\d), (\d)\] '[a-d]{2}'\n", report)
    statistic, p_value = re.search(r"chi-square = (\S+) on \d+ degrees of freedom, p-value = (\S+) ", report).groups()
    assert float(statistic) > 50 and float(p_value) < 1e-6  # the law moved, as lenience allows
    assert check.dof == len(check.cells) and 0 < check.statistic < 1 / 0.3 ** 2


def test_a_law_above_the_lenience_bound_fails():
    """Power: against a reference law that is not the target's, the bound is broken by far (a bound of 1.23x at
    l = 0.9, k = 2), and the check fails at its significance."""
    table, target, draft = pair(7)
    wrong = markov.random_table(4, 99, concentration=0.5)
    logits = lambda ids: markov.plain_model(wrong)(torch.tensor([ids]))[0, -1]  # noqa: E731
    check = testing.check_distribution(target, draft, PROMPT, k=2, lenience=0.9, samples=2000,
                                       target_logits=logits, progress=False)
    assert not check.passed and check.p_value < 1e-6 and check.statistic > 1 / 0.9 ** 2
    assert "lenience check FAILED" in check.report
    assert re.search(r"closest to the bound: \[\d(, [\d*])?\]", check.report), check.report


def test_lenience_at_temperature_zero_follows_the_argmax_rule():
    _, target, draft = pair(21, independent_draft=True, concentration=0.5)
    check = testing.check_distribution(target, draft, PROMPT, k=3, gamma=2, temperature=0.0, lenience=0.2,
                                       samples=20, progress=False)
    assert check.passed and check.test == "argmax rule" and "p(x) >= l max p" in check.report
    wrong = markov.random_table(4, 99, concentration=0.5)
    logits = lambda ids: -markov.plain_model(wrong)(torch.tensor([ids]))[0, -1]  # noqa: E731  (argmin)
    broken = testing.check_distribution(target, draft, PROMPT, k=3, gamma=2, temperature=0.0, lenience=0.2,
                                        samples=20, target_logits=logits, progress=False)
    assert not broken.passed and broken.impossible == 20 and "20 sample(s) breaking the rule" in broken.report


def test_progress_shows_the_generations_left(capsys):
    _, target, draft = pair(4)
    testing.check_distribution(target, draft, PROMPT, k=1, samples=30, seed=1)
    err = capsys.readouterr().err
    assert "check_distribution: generations" in err and "30/30" in err
    testing.check_distribution(target, draft, PROMPT, k=1, samples=30, seed=1, progress=False)
    assert capsys.readouterr().err == ""


def test_tokens_of_probability_zero_fail_outright():
    table, target, draft = pair(7)
    wrong = markov.random_table(4, 99, mask_prob=0.5)  # a reference that forbids tokens the target emits
    logits = lambda ids: markov.plain_model(wrong)(torch.tensor([ids]))[0, -1]  # noqa: E731
    check = testing.check_distribution(target, draft, PROMPT, k=2, samples=200, target_logits=logits)
    assert check.impossible > 0 and check.p_value == 0.0 and not check.passed
    assert "target probability 0" in check.report


class Letters:
    """A tokenizer as transformers' are called (decode(ids) -> str): token i is the letter "abcdefgh"[i]."""

    def decode(self, ids):
        return "".join("abcdefgh"[i] for i in ids)


def label(cell, bins, pooled, tokens=4) -> str:
    """How the report writes a cell with the Letters tokenizer: ids in brackets and their text; a bin's first
    `tokens` tokens, each with its text, and a count of the rest; a pooled cell's first three members."""
    text = lambda ids: f" {Letters().decode(ids)!r}" if ids else ""  # noqa: E731
    if cell[0] == "pooled":
        members = pooled[cell[1]]
        more = f"; ... {len(members) - 3} more" if len(members) > 3 else ""
        return f"pooled, {len(members)} cells: " + "; ".join(label(m, bins, pooled, 2) for m in members[:3]) + more
    if "*" not in cell:
        return f"[{', '.join(map(str, cell))}]{text(list(cell))}"
    prefix, members = list(cell[:-2]), bins[cell]
    listed = ", ".join(f"{t}{text([t])}" for t in members[:tokens])
    more = f", ... {len(members) - tokens} more" if len(members) > tokens else ""
    return f"[{', '.join([*map(str, prefix), '*'])}]{text(prefix)} * in {{{listed}{more}}}"


def test_report_names_each_cell_by_its_tokens():
    """A new user's issue: the report labelled cells "[* (bin 0)]" and "pooled 0". It now states its notation and
    writes each cell as its tokens with their text (through the tokenizer); a bin lists its tokens, a pooled cell
    the cells it joins. check.bins and check.pooled hold the same, and they are what the counts were summed over:
    a bin is expected its tokens' exact mass, a pooled cell its members' sum, and the cells partition the
    sequences."""
    table, draft_table = markov.target_and_draft(8, 1, concentration=0.3)
    target, draft = markov.cached_model(table), markov.cached_model(draft_table)
    samples = 300
    check = testing.check_distribution(target, draft, PROMPT, k=2, gamma=2, samples=samples, seed=0,
                                       tokenizer=Letters(), progress=False)
    assert check.passed, check.report
    bins, pooled = dict(check.bins), check.pooled
    assert len(pooled) == 1 and len(pooled[0]) >= 4 and len(bins) >= 5  # this pair has every kind of cell
    law = markov.continuation_law(table, PROMPT, 2)  # [8, 8]

    def exact(cell) -> float:  # expected count
        if "*" not in cell:
            return samples * law[cell].item()
        prefix, tokens = cell[:-2], list(bins[cell])
        return samples * (law[tokens].sum() if not prefix else law[prefix[0], tokens].sum()).item()

    covered = torch.zeros(8, 8, dtype=torch.long)  # how many cells each sequence falls in
    for cell, _, expected in check.cells:
        members = pooled[cell[1]] if cell[0] == "pooled" else [cell]
        assert expected == pytest.approx(sum(exact(m) for m in members), rel=1e-6), cell
        for member in members:
            if "*" not in member:
                covered[member] += 1
            elif len(member) == 2:
                covered[list(bins[member])] += 1
            else:
                covered[member[0], list(bins[member])] += 1
    assert bool((covered == (law > 0).long()).all())

    report = check.report
    assert "(bin" not in report and "pooled 0" not in report
    assert ("  cells: [5, 2] is token 5 then token 2; [5, *] * in {7, 9, ... 3 more} is token 5 then token 7, 9 "
            "or one of 3 less likely ones\n  (a bin of the continuations too unlikely for cells of their own, most "
            "likely first); 'pooled' joins cells expected fewer than 5 times each; text decoded after the prompt\n"
            in report)
    assert f"  {len(pooled[0])} cells expected fewer than 5 times each are pooled into 1\n" in report
    rows = re.findall(r"\n +(\d+) +([\d.]+) +[\d.]+  (.*)", report)
    assert len(rows) == 8
    written = {(str(o), f"{e:.1f}", label(cell, bins, pooled)) for cell, o, e in check.cells}
    assert set(rows) <= written, report
    kinds = {"pooled" if text.startswith("pooled") else "bin" if " * in {" in text else "sequence"
             for _, _, text in rows}
    assert kinds == {"pooled", "bin", "sequence"}, report
    # without a tokenizer: the same cells, ids only
    plain = testing.check_distribution(target, draft, PROMPT, k=2, gamma=2, samples=samples, seed=0, progress=False)
    assert plain.cells == check.cells and plain.bins == check.bins and plain.pooled == check.pooled
    assert "'" not in plain.report.split("largest contributions:")[1] and "text decoded" not in plain.report
    with pytest.raises(ValueError, match="tokenizer must have a decode"):
        testing.check_distribution(target, draft, PROMPT, samples=5, tokenizer=3)


def test_argmax_has_one_cell():
    _, target, draft = pair(5)
    check = testing.check_distribution(target, draft, PROMPT, k=3, gamma=2, temperature=0.0, samples=50)
    assert check.passed and check.dof == 0 and check.p_value == 1.0 and len(check.cells) == 1
    assert testing.assert_distribution(target, draft, PROMPT, k=3, gamma=2, temperature=0.0, samples=50) == check


def test_larger_vocabulary_is_partitioned(tmp_path):
    """Vocabulary 64, k = 3, 400 samples: only prefixes likely enough for a cell of expected count 5 are
    expanded (at most k * samples / 5 target calls), the rest of each prefix is one "prefix + *" cell."""
    torch.manual_seed(0)
    config = TinyGPTConfig(vocab_size=64, n_layer=1, n_head=2, d_model=16, max_length=32)
    target_gpt, draft_gpt = TinyGPT(config), TinyGPT(config)
    with torch.no_grad():  # peaked distributions: a few likely tokens per position
        target_gpt.tok_emb.weight.mul_(20)
        draft_gpt.tok_emb.weight.copy_(target_gpt.tok_emb.weight + 0.3 * torch.randn(64, 16))
    path = tmp_path / "target.pt"
    script_plain(target_gpt).save(str(path))
    reference = testing.sequence_logits(str(path), "target")
    calls = []
    check = testing.check_distribution(speculant.load(path), script_plain(draft_gpt), [1, 2], k=3, gamma=2,
                                       samples=400, target_logits=lambda ids: calls.append(ids) or reference(ids)[-1])
    assert check.passed, check.report
    assert 1 < len(calls) <= 3 * 400 / 5
    kinds = {"pooled" if cell[0] == "pooled" else "rest" if "*" in cell else "complete" for cell, _, _ in check.cells}
    assert kinds == {"pooled", "rest", "complete"} and check.dof >= 5
    assert all(e >= 5 for _, _, e in check.cells)
    # the same check with the reference taken from the file behind the loaded model
    assert testing.check_distribution(speculant.load(path), script_plain(draft_gpt), [1, 2], k=3, gamma=2,
                                      samples=400) == check


def test_inputs():
    _, target, draft = pair(3)
    in_memory = speculant.load(target)
    with pytest.raises(ValueError, match="memory"):
        testing.check_distribution(in_memory, draft, PROMPT)
    for kwargs, match in [(dict(k=0), "k must"), (dict(samples=0), "samples"), (dict(significance=1.0), "significance"),
                          (dict(generate_kwargs={"eos_token_id": 1}), "eos_token_id"), (dict(gamma=0), "gamma")]:
        with pytest.raises(ValueError, match=match):
            testing.check_distribution(target, draft, PROMPT, **kwargs)
    with pytest.raises(ValueError, match=r"shape \[V\]"):
        testing.check_distribution(target, draft, PROMPT, samples=5, target_logits=lambda ids: torch.zeros(1, 4))


class SourceMarkov(markov.MarkovCached):
    """The encoder-decoder contract over table models: ``encode`` picks the decoder's table by the source's
    parity, so logits computed without the source would be wrong."""

    def __init__(self, tables: torch.Tensor):  # [2, 2, V+1, V, V]
        super().__init__(tables[0])
        self.register_buffer("tables", tables.clone())

    @torch.jit.export
    def encode(self, input_ids: torch.Tensor) -> None:
        self.table.copy_(self.tables[int(input_ids.sum().item()) % 2])
        self.truncate(0)


def test_encoder_decoder_source_reaches_the_reference():
    tables = torch.stack([markov.random_table(4, 31), markov.random_table(4, 32)]).float()
    drafts = torch.stack([markov.perturb(t.double(), 5, 0.7) for t in tables]).float()
    target, draft = torch.jit.script(SourceMarkov(tables)), torch.jit.script(SourceMarkov(drafts))
    check = testing.check_distribution(target, draft, [0], gamma=2, samples=1500,
                                       generate_kwargs={"encoder_input_ids": [1, 2, 2]})
    assert check.passed, check.report
    exact = markov.continuation_law(tables[1].double(), [0], 2, 1.0)  # source sum 5: odd, table 1
    complete = [(cell, e) for cell, _, e in check.cells if "*" not in cell and cell[0] != "pooled"]
    assert complete and all(e / 1500 == pytest.approx(exact[cell].item(), abs=1e-6) for cell, e in complete)


def test_a_thin_law_over_a_large_vocabulary_keeps_its_power():
    """No single token reaches 5 expected samples (vocabulary 64, 200 samples, near-uniform target): the
    unlikely continuations are binned by probability rather than pooled into one cell, so a wrong reference
    (uniform) is still rejected, and the right one is not."""
    target_logits = torch.linspace(0.0, 3.0, 64)  # probabilities from about 0.004 to 0.08: thin but not flat
    table = markov.constant_table(torch.softmax(target_logits, 0))
    draft_table = markov.constant_table(torch.full((64,), 1 / 64))
    target, draft = markov.cached_model(table), markov.cached_model(draft_table)
    right = testing.check_distribution(target, draft, [1], k=1, gamma=2, samples=200, seed=3)
    assert right.passed and right.dof >= 10, right.report
    wrong = testing.check_distribution(target, draft, [1], k=1, gamma=2, samples=200, seed=3,
                                       target_logits=lambda ids: torch.zeros(64))
    assert not wrong.passed and wrong.dof >= 10, wrong.report
    # cells are single tokens or bins of the first token, labelled with no empty prefix: "[*] * in {...}", not
    # "[, *]", the bin's tokens listed (its most likely first)
    labels = re.findall(r"\n +\d+ +[\d.]+ +[\d.]+  (.*)", wrong.report)
    assert len(labels) == 8 and any(label.startswith("[*] * in {") for label in labels), wrong.report
    bins = dict(wrong.bins)
    for label in labels:
        listed = re.fullmatch(r"\[\d+\]|\[\*\] \* in \{(\d+(?:, \d+)*)(?:, \.\.\. (\d+) more)?\}", label)
        assert listed, label
        if listed.group(1):  # a bin: its most likely tokens (four at most), and how many more it has
            tokens = tuple(int(t) for t in listed.group(1).split(", "))
            members = next(members for members in bins.values() if members[:len(tokens)] == tokens)
            assert len(tokens) == min(4, len(members)) and len(members) == len(tokens) + int(listed.group(2) or 0)


def hf_pair(arch):
    from support import hf_models  # transformers, only for these tests

    model = hf_models.make(arch, seed=0)
    return model, hf_models.drafted(model, noise=1e-4 if arch == "t5" else 0.01, seed=1)


@pytest.mark.parametrize("arch", ["gpt2", "t5"])
def test_live_models_and_save_pretrained_directories(arch, tmp_path):
    """check_distribution takes what speculant.load takes: transformers objects and save_pretrained directories
    (issue 25: the first raised TypeError, the second torch's "is a directory"); the reference is the model's
    own uncached forward, the same from the object, the directory and the loaded handle."""
    model, draft = hf_pair(arch)
    source = [5, 9, 13, 2] if arch == "t5" else None
    prompt = [0] if arch == "t5" else [1, 5, 9]
    extra = dict(generate_kwargs={"encoder_input_ids": source}) if source else {}
    model.save_pretrained(tmp_path / "target")
    draft.save_pretrained(tmp_path / "draft")
    with torch.no_grad():
        ids = torch.tensor([prompt + [7, 3]])
        if source:
            expected = model(input_ids=torch.tensor([source]), decoder_input_ids=ids).logits[0, -1]
        else:
            expected = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0, -1]
    for target in (model, tmp_path / "target", str(tmp_path / "target"), speculant.load(model)):
        reference = testing.sequence_logits(target, "target", source)  # check_distribution's, row -1
        torch.testing.assert_close(reference(prompt + [7, 3])[-1], expected, rtol=0, atol=1e-4)
    checks = [testing.check_distribution(target, d, prompt, k=2, gamma=2, samples=200, seed=1, **extra)
              for target, d in [(model, draft), (tmp_path / "target", tmp_path / "draft")]]
    for check in checks:
        assert check.passed and check.impossible == 0 and check.dof >= 3, check.report
        assert sum(o for _, o, _ in check.cells) == 200 and sum(e for _, _, e in check.cells) == pytest.approx(200)
    # the same models in memory and on disk: the same samples, the same law (up to rounding)
    assert [(c, o) for c, o, _ in checks[0].cells] == [(c, o) for c, o, _ in checks[1].cells]
    assert [e for _, _, e in checks[0].cells] == pytest.approx([e for _, _, e in checks[1].cells], rel=1e-4)


def test_live_reference_is_padded_to_the_loaded_vocabulary():
    model, draft = hf_pair("gpt2")
    target = speculant.load(model, vocab_size=80)
    row = testing.sequence_logits(target, "target")([1, 5, 9])[-1]
    assert row.shape == (80,) and bool(torch.isinf(row[64:]).all()) and bool(torch.isfinite(row[:64]).all())
    check = testing.check_distribution(target, speculant.load(draft, vocab_size=80), [1, 5, 9], k=1, gamma=2,
                                       samples=100)
    assert check.passed and check.impossible == 0, check.report
