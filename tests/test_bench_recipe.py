"""The benchmark recipe and benchmark plumbing (benchmarks/train_pairs.py, benchmarks/assisted.py) on the smoke
configuration: a tiny tokenizer and models trained for 2 steps on a few stdlib modules, saved with
save_pretrained, exported with speculant.export, then one prompt, γ ∈ {1, 2}, 4 new tokens. Checks the files,
the output table's columns, the goal printout and plots, and that speculant's greedy tokens equal transformers'
greedy tokens for the same pair (GPT-2 and T5)."""

import json
import os
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import assisted  # noqa: E402
import train_pairs  # noqa: E402

import speculant  # noqa: E402


@pytest.mark.parametrize("recipe", [train_pairs.GPT2_CPU.smoke(), train_pairs.T5_CPU.smoke()],
                         ids=["gpt2", "t5"])
def test_smoke_recipe_and_benchmark(recipe, tmp_path):
    out = train_pairs.build(recipe, cache=tmp_path, progress=False)
    assert out.parent == tmp_path / "bench" and out.name.startswith(recipe.kind + "-")
    info = json.loads((out / "pair.json").read_text())
    for role in ("target", "draft"):
        assert (out / role / "config.json").exists() and (out / role / "tokenizer.json").exists()
        assert info[role]["params"] > 0 and info[role]["heldout_loss"] > 0
        assert info[role]["export"]["architecture"] == ("GPT2LMHeadModel" if recipe.kind == "gpt2"
                                                        else "T5ForConditionalGeneration")
    assert info["vocab_size"] == recipe.vocab_size
    assert train_pairs.build(recipe, cache=tmp_path, progress=False) == out  # cached: nothing retrained

    pair = assisted.load_pair(recipe, "cpu", cache=tmp_path)
    prompts = train_pairs.heldout_prompts(recipe, out, 1, 8)
    frames = []
    for temperature in (0.0, 1.0):
        rows, facts = assisted.measure(pair, temperature, gammas=[1, 2], prompts=prompts, max_new_tokens=4,
                                       repeats=1, progress=False)
        frame = pd.DataFrame(rows, columns=assisted.COLUMNS)
        assert list(frame.gamma) == [1, 2] and not frame[["speculant_tps", "hf_plain_tps", "hf_assisted_tps",
                                                          "alpha", "c", "predicted"]].isna().any().any()
        assert (frame.speedup_min <= frame.speedup).all() and (frame.speedup <= frame.speedup_max).all()
        frames.append(frame)
    # greedy: speculant (plain and speculative) against transformers' own generate on the same pair
    assert facts["greedy_mismatches"]["speculant_plain"] == 0 and int(frames[0].greedy_mismatches.sum()) == 0
    expected = assisted.hf_generate(pair, prompts[0], 0.0, 4, seed=0, assisted=False)
    plain = speculant.generate(pair.target, **prompts[0], max_new_tokens=4, temperature=0, eos_token_id=pair.eos)
    spec = speculant.SpeculativeDecoder(pair.target, pair.draft, gamma=2, temperature=0).generate(
        **prompts[0], max_new_tokens=4, eos_token_id=pair.eos)
    assert plain.tokens == expected and spec.tokens == expected

    frame = pd.concat(frames, ignore_index=True)
    table = assisted.summary(frame)
    assert {"best_gamma", "alpha", "c", "predicted", "speedup", "vs_hf", "plain_vs_hf"} <= set(table.columns)
    assert len(table) == 2
    lines = assisted.goals(table)
    assert len(lines) == 6 and all(line.startswith(("[met]", "[NOT met]")) for line in lines)
    assert "| pair | temperature | gamma |" in assisted.full_table(frame)
    (path,) = assisted.plot(frame, tmp_path / "plots")
    assert path.stat().st_size > 0


def test_tables_from_stored_results(capsys):
    """--tables-from reprints the tables from the stored result files: every speedup the median of the
    per-repetition ratios, with its min-max."""
    results = assisted.RESULTS
    files = sorted(str(f) for f in results.glob("*-cpu-cpu-T*.json"))
    if not files:
        pytest.skip("no stored results")
    assisted.main(["--tables-from", *files])
    out = capsys.readouterr().out
    assert "measured min–max" in out and "biased upward" in out and "transformers assisted min–max" in out
    meta = json.loads(Path(files[0]).read_text())
    tps = meta["tps_repeats"]
    frame = assisted.add_spread(pd.read_csv(Path(files[0]).with_suffix(".csv")), tps)
    ratios = sorted(a / b for a, b in zip(tps["speculant1"], tps["speculant_plain"]))
    row = frame[frame.gamma == 1].iloc[0]
    expected = (ratios[0], float(pd.Series(ratios).median()), ratios[-1])
    assert (row.speedup_min, row.speedup, row.speedup_max) == pytest.approx(expected)
