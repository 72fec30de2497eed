"""The Figure 1 trace views: exact renderings of a hand-built trace (ids, text through a tokenizer, ANSI, HTML),
tokenizers that need context to decode a piece, and a trace from the engine."""

import io
import re
import sys
from types import SimpleNamespace

import pytest

from support import markov
import speculant
from speculant.demo_pair import decode, encode


def iteration(drafted, accepted, token, emitted=None):
    emitted = accepted + 1 if emitted is None else emitted
    return SimpleNamespace(drafted=drafted, accepted=accepted, token=token, bonus=accepted == len(drafted),
                           emitted=emitted)


# "Hi!" (all accepted, bonus "!"), " W" after rejecting "x" (correction "W"), then "ab" and the run is cut
# by max_new_tokens before "c" and the bonus token "d".
TRACE = speculant.Trace([iteration(encode("Hi"), 2, ord("!")), iteration(encode(" x"), 1, ord("W")),
                         iteration(encode("abc"), 3, ord("d"), emitted=2)])


def test_spelled_out_with_ids_and_with_text():
    assert TRACE.render(color=False) == (
        "  1 | [accepted:72 105 ][bonus:33 ]\n"
        "  2 | 72 105 33 [accepted:32 ][rejected:120 ][correction:87 ]\n"
        "  3 | 72 105 33 32 87 [accepted:97 98 ]")
    text = TRACE.with_tokenizer(decode)
    assert text.render(color=False, prefix=">") == (
        "  1 | >[accepted:Hi][bonus:!]\n"
        "  2 | >Hi![accepted: ][rejected:x][correction:W]\n"
        "  3 | >Hi! W[accepted:ab]")
    assert TRACE.render(color=False, tokenizer=decode, context=3).splitlines()[2] == "  3 | \u2026! W[accepted:ab]"
    assert TRACE.with_decoder(decode).render(color=False) == text.render(color=False)


def test_colours_and_html():
    assert TRACE.render(color=True, tokenizer=decode).splitlines()[1] == (
        "  2 | Hi!\033[32m \033[0m\033[31;9mx\033[0m\033[34mW\033[0m")
    assert "\033[34;4m!\033[0m" in TRACE.render(color=True, tokenizer=decode)  # the bonus token, underlined
    html = speculant.Trace([iteration(encode("<&"), 1, ord("\n"))], decode)._repr_html_()
    assert html == ("<div style='font-family:monospace;white-space:pre-wrap'>  1 | "
                    '<span style="color:#1a7f37">&lt;</span>'
                    '<span style="color:#cf222e;text-decoration:line-through">&amp;</span>'
                    '<span style="color:#0969da">\u21b5</span></div>')


class Stream(io.StringIO):
    def __init__(self, tty: bool):
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_colour_only_on_a_terminal_without_no_color(monkeypatch):
    """Issue 25: ANSI escapes only when the stream is a TTY and NO_COLOR (https://no-color.org) is unset or empty;
    an explicit color= wins either way. render() asks about sys.stdout."""
    use_color = speculant.trace.use_color
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert use_color(Stream(tty=True)) and not use_color(Stream(tty=False))
    assert not use_color(object())  # no isatty at all
    monkeypatch.setattr(sys, "stdout", Stream(tty=False))
    assert "\033" not in TRACE.render() and "[bonus:33 ]" in TRACE.render()
    monkeypatch.setattr(sys, "stdout", Stream(tty=True))
    assert "\033[34;4m" in TRACE.render()
    monkeypatch.setenv("NO_COLOR", "")  # empty: as if unset
    assert use_color(Stream(tty=True)) and "\033" in TRACE.render()
    monkeypatch.setenv("NO_COLOR", "1")
    assert not use_color(Stream(tty=True)) and "\033" not in TRACE.render()
    assert use_color(Stream(tty=True), True) and "\033" in TRACE.render(color=True)
    monkeypatch.delenv("NO_COLOR")
    assert not use_color(Stream(tty=True), False) and "\033" not in TRACE.render(color=False)


class SentencePieceLike:
    """Drops the leading space of the text, as SentencePiece tokenizers do: a word alone decodes bare."""

    pieces = ["\u2581Hello", "\u2581world", "!"]

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids).replace("\u2581", " ").lstrip(" ")


def test_pieces_decode_in_context():
    trace = speculant.Trace([iteration([0], 1, 1, emitted=2), iteration([2], 1, 2, emitted=1)])
    assert trace.render(color=False, tokenizer=SentencePieceLike()) == (
        "  1 | [accepted:Hello][bonus: world]\n"
        "  2 | Hello world[accepted:!]")
    # "é" split over two byte tokens: each line decodes the whole output, so no U+FFFD stays behind
    split = speculant.Trace([iteration([0xC3], 1, 0xA9), iteration([0x21], 1, 0x21)], decode)
    assert split.render(color=False).splitlines()[1] == "  2 | \u00e9[accepted:!][bonus:!]"
    with pytest.raises(ValueError, match="tokenizer"):
        TRACE.with_tokenizer(42)


def test_engine_trace_renders_its_output():
    """Every line starts with the output so far, and its accepted and correction / bonus pieces continue it."""
    target, draft = markov.target_and_draft(4, 1)
    decoder = speculant.SpeculativeDecoder(speculant.load(markov.cached_model(target)),
                                           speculant.load(markov.cached_model(draft)), gamma=3)
    result = decoder.generate([1, 2], max_new_tokens=30, seed=0)
    letters = lambda ids: "".join("abcd"[i] for i in ids)  # noqa: E731
    lines = result.trace.with_tokenizer(letters).render(color=False, context=None).splitlines()
    assert len(lines) == len(result.trace) == result.stats.target_calls
    output = ""
    for i, line in enumerate(lines):
        assert line.startswith(f"{i + 1:>3} | {output}[")
        output += "".join(text for kind, text in re.findall(r"\[(\w+):([a-d]*)\]", line) if kind != "rejected")
    assert output == letters(result.tokens)
    assert "[rejected:" in "".join(lines) and "[correction:" in "".join(lines)
    assert repr(result.trace) == f"speculant.Trace({len(lines)} iterations)"
