"""The `speculant` command: its help lists every command and every option with its default, the demo runs on
the demo pair (smoke-sized here) and reports warmed-up, repeated timings next to Theorem 3.8, and bad values
are refused with a message naming them."""

import argparse
import io
import os
import re
import subprocess
import sys

import pytest
import torch

import speculant

from speculant import __main__ as cli
from speculant import demo, demo_pair


def subcommands(parser: argparse.ArgumentParser) -> dict:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_top_level_help_describes_every_command(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    commands = subcommands(cli.parser())
    assert sorted(commands) == ["demo", "export"]
    assert "speculative decoding with the demo pair" in text and "Theorem 3.8" in text
    assert "transformers model" in text and ".pt2" in text
    assert cli.main([]) == 2 and "COMMAND" in capsys.readouterr().err  # no command: the help, as an error


@pytest.mark.parametrize("command", ["demo", "export"])
def test_every_option_has_a_help_with_its_default(command):
    parser = subcommands(cli.parser())[command]
    text = " ".join(parser.format_help().split("\noptions:\n")[1].split())  # the options' section, one line
    options = [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]
    assert len(options) >= 4
    starts = [text.index(f"{action.option_strings[0]} ") for action in options] + [len(text)]
    for action, start, end in zip(options, starts, starts[1:]):
        entry = text[start:end]  # the option, its metavar and its help
        assert action.help and "(default: " in entry, entry


def test_demo_reports_timed_rounds_next_to_theorem_3_8(smoke_pair, monkeypatch, capsys):
    monkeypatch.setattr(demo_pair, "default_pair", lambda *args, **kwargs: smoke_pair)
    assert cli.main(["demo", "--max-new-tokens", "24", "--repeats", "4", "--color", "never", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "4 rounds, speculative and plain interleaved, with 1 torch thread" in out and "untimed warm-up" in out
    assert "measured (median of 4 rounds, range " in out and "Theorem 3.8 predicts " in out
    assert "x at the costs the engine measured (wide verification calls" in out
    assert "gamma=4 temperature=0.8" in out and "seed=3" in out


def test_the_demos_headline_and_table_give_one_speedup(smoke_pair, monkeypatch):
    """Issue 67: the table said 2,438 tokens/s speculative against 2,664 plain while the headline said 1.06x (a
    median of the rounds' ratios beside a ratio of medians). Now the table's tokens per second are the round
    whose speedup is the headline's median (an odd count of rounds has one), so their ratio is the headline."""
    from speculant import demo

    monkeypatch.setattr(demo_pair, "default_pair", lambda *args, **kwargs: smoke_pair)
    out = io.StringIO()
    shown = demo.run(max_new_tokens=24, repeats=3, color=False, out=out, seed=1)
    speculative, plain = shown["tokens_per_second"]
    assert speculative / plain == pytest.approx(shown["speedup"], rel=1e-9)
    (row,) = [line for line in out.getvalue().splitlines() if line.strip().startswith("tokens per second")]
    assert f"{speculative:,.0f} (" in row and f"{plain:,.0f} (" in row
    assert f"{shown['speedup']:.2f}x measured (median of 3 rounds" in out.getvalue()
    assert shown["threads"] == 1


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("no_color,color,coloured", [
    (None, None, True), ("1", None, False), ("1", True, True), (None, False, False)])
def test_demo_colours_only_a_terminal_without_no_color(no_color, color, coloured, smoke_pair, monkeypatch):
    """Issue 25: on a terminal the trace is coloured unless NO_COLOR is set (https://no-color.org); --color
    always / never (color=True / False) decides outright."""
    monkeypatch.setattr(demo_pair, "default_pair", lambda *args, **kwargs: smoke_pair)
    if no_color is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", no_color)
    out = Terminal()
    demo.run(max_new_tokens=8, repeats=1, color=color, out=out)
    text = out.getvalue()
    assert ("\033[" in text) == coloured and ("green: accepted draft tokens" in text) == coloured


@pytest.mark.parametrize("argv,match", [
    (["--gamma", "0"], "gamma must be an integer >= 1"),
    (["--repeats", "0"], "repeats must be an integer >= 1"),
    (["--lenience", "1.5"], "lenience must be in (0, 1]"),
    (["--top-p", "0"], "top_p must be in (0, 1]"),
    (["--temperature", "-1"], "temperature must be a finite number >= 0"),
    (["--max-new-tokens", "0"], "max_new_tokens must be an integer >= 1"),
    (["--seed", "-2"], "seed must be an integer >= 0"),
    (["--threads", "0"], "threads must be an integer >= 1"),
    (["--device", "gpu0"], "device must name a torch device"),
] + ([] if torch.cuda.is_available() else [(["--device", "cuda"], "this torch sees no CUDA device")]))
def test_demo_refuses_bad_values_by_name_before_it_loads_models(argv, match, monkeypatch, capsys):
    """Issue 51: the options were checked only after the pair was made (an hour of training on a busy machine)."""
    monkeypatch.setattr(demo_pair, "default_pair", lambda *args, **kwargs: pytest.fail("the pair was loaded"))
    assert cli.main(["demo", *argv]) == 2
    assert match in capsys.readouterr().err


def test_demo_without_its_weights_says_how_to_make_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(demo_pair, "WEIGHTS", tmp_path)
    monkeypatch.setenv("SPECULANT_CACHE", str(tmp_path / "cache"))
    assert cli.main(["demo", "--repeats", "1"]) == 2
    err = capsys.readouterr().err
    assert "the demo pair's weights are missing" in err and "python -m speculant.demo.pair --train" in err


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert re.fullmatch(rf"speculant {re.escape(speculant.__version__)} \(torch {re.escape(torch.__version__)}\)\n",
                        capsys.readouterr().out)


def test_the_shipped_demo_prints_its_trace_without_torchs_warnings(tmp_path):
    """The demo in a fresh process on the shipped pair: its output opens with the demo's own lines (TorchScript's
    deprecation notices were printed first), and it trains nothing."""
    env = {**os.environ, "SPECULANT_CACHE": str(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-m", "speculant", "demo", "--max-new-tokens", "16", "--repeats", "1",
                           "--color", "never"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("speculant demo: target ") and "Trace (one line per target call" in done.stdout
    assert "`torch.jit." not in done.stderr and "speculant demo target" not in done.stderr  # no notice, no training
    assert [p.name.startswith("shipped-") for p in (tmp_path / "models").iterdir() if p.is_dir()] == [True]
