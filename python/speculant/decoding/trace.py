"""The per-iteration trace of a generation, drawn like the paper's Figure 1: draft tokens the target accepted
(green), the rejected draft token (red, struck through; the drafts after it are discarded unseen) and the
target's correction (blue) or, when all gamma were accepted, its bonus token (blue, underlined).

Tokens are shown as ids, or as text through a tokenizer: anything with ``decode(ids) -> str`` (a Hugging Face
tokenizer, a ``tokenizers.Tokenizer``) or a callable ``ids -> str`` (``speculant.demo_pair.decode`` for the
byte-level demo). Each piece is decoded after the tokens before it (the text of ``context + piece`` past the
text of ``context``), so tokenizers that drop a word's leading space when it stands alone (SentencePiece) and
characters split over several byte tokens come out as they do in the whole text.

ANSI colours go only to a terminal: ``use_color`` says yes when the stream is a TTY and the NO_COLOR
environment variable (https://no-color.org) is unset or empty, unless told outright (``color=True`` / ``False``).
"""

from __future__ import annotations

import html
import os
import sys
from typing import Callable, List, Optional, Sequence, TextIO, Tuple, Union

from .._core import Iteration

Decode = Callable[[List[int]], str]
Tokenizer = Union[Decode, object]  # a callable ids -> str, or an object with decode(ids) -> str

_ANSI = {"accepted": "\033[32m", "rejected": "\033[31;9m", "correction": "\033[34m", "bonus": "\033[34;4m",
         "reset": "\033[0m"}
_CSS = {"accepted": "color:#1a7f37", "rejected": "color:#cf222e;text-decoration:line-through",
        "correction": "color:#0969da", "bonus": "color:#0969da;text-decoration:underline"}
_CONTEXT_TOKENS = 8  # tokens of context a piece is decoded after


def use_color(stream: Optional[TextIO] = None, color: Optional[bool] = None) -> bool:
    """Whether to write ANSI colours to ``stream`` (default sys.stdout): ``color`` if given (an explicit choice,
    such as ``speculant demo --color always``, wins over NO_COLOR), else whether the stream is a terminal and
    NO_COLOR is unset or empty."""
    if color is not None:
        return bool(color)
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(sys.stdout if stream is None else stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except (OSError, ValueError):  # a closed or detached stream
        return False


def decode_function(tokenizer: Optional[Tokenizer]) -> Optional[Decode]:
    """The ids -> str function of a tokenizer: its decode method, or the tokenizer itself if it is callable. None
    for None."""
    if tokenizer is None:
        return None
    decode = getattr(tokenizer, "decode", None)
    if callable(decode):
        return decode
    if callable(tokenizer):
        return tokenizer
    raise ValueError("tokenizer must have a decode(ids) -> str method or be a callable ids -> str, got "
                     f"{type(tokenizer).__name__}")


def _segments(it: Iteration) -> List[Tuple[str, List[int]]]:
    """(kind, tokens) pieces of one iteration, in order, as far as they were emitted."""
    kept = list(it.drafted[: min(it.accepted, it.emitted)])
    pieces = [("accepted", kept)] if kept else []
    if it.accepted < len(it.drafted):
        pieces.append(("rejected", [it.drafted[it.accepted]]))
    if it.emitted > it.accepted:
        pieces.append(("bonus" if it.bonus else "correction", [it.token]))
    return pieces


def _emitted(it: Iteration) -> List[int]:
    """The tokens an iteration added to the output."""
    tokens = list(it.drafted[: min(it.accepted, it.emitted)])
    return tokens + [it.token] if it.emitted > it.accepted else tokens


def _visible(text: str) -> str:
    """One line of text: newlines and tabs made visible."""
    return text.replace("\n", "\u21b5").replace("\t", "\u2192").replace("\r", "")


def _text(decode: Optional[Decode], tokens: List[int]) -> str:
    return decode(tokens) if decode is not None else "".join(f"{t} " for t in tokens)


def decoded_piece(decode: Optional[Decode], context: List[int], tokens: List[int]) -> str:
    """The text ``tokens`` add after ``context`` (decoded after its last _CONTEXT_TOKENS tokens)."""
    if decode is None:
        return _text(decode, tokens)
    context = context[-_CONTEXT_TOKENS:]
    before, after = decode(context), decode(context + tokens)
    common = 0
    while common < min(len(before), len(after)) and before[common] == after[common]:
        common += 1
    return after[common:]


class Trace(Sequence[Iteration]):
    """A sequence of speculant.Iteration with terminal (``render``) and Jupyter (``_repr_html_``) views."""

    def __init__(self, iterations: Sequence[Iteration], tokenizer: Optional[Tokenizer] = None):
        self._iterations = list(iterations)
        self._decode = decode_function(tokenizer)
        self.tokenizer = tokenizer

    def __getitem__(self, index):
        return self._iterations[index]

    def __len__(self) -> int:
        return len(self._iterations)

    def with_tokenizer(self, tokenizer: Tokenizer) -> "Trace":
        """The same trace, showing tokens as text through ``tokenizer`` (see the module docstring)."""
        return Trace(self._iterations, tokenizer)

    with_decoder = with_tokenizer  # the same, named for a bare ids -> str function

    def _lines(self, decode: Optional[Decode], levels: bool = True) -> List[Tuple[str, str, List[Tuple[str, str]]]]:
        """Per iteration: its label, the output's text before it, and its (kind, text) pieces. With ``levels``, a
        hierarchical draft's iterations (Iteration.inner) follow the iteration they drafted for, labelled
        "1.1", "1.2", ... after the output plus what that level emitted before them."""
        lines = []

        def walk(iterations: Sequence[Iteration], output: List[int], label: str) -> None:
            for i, it in enumerate(iterations):
                name, pieces, context = f"{label}{i + 1}", [], list(output)
                for kind, tokens in _segments(it):
                    pieces.append((kind, _visible(decoded_piece(decode, context, tokens))))
                    if kind == "accepted":
                        context += tokens
                lines.append((name, _visible(_text(decode, output)), pieces))
                inner = getattr(it, "inner", None)  # hand-made iterations (tests, notebooks) may have none
                if levels and inner:
                    walk(inner, list(output), name + ".")
                output += _emitted(it)

        walk(self._iterations, [], "")
        return lines

    def render(self, color: Optional[bool] = None, prefix: str = "", context: Optional[int] = 60,
               tokenizer: Optional[Tokenizer] = None, levels: bool = True) -> str:
        """One line per iteration (one target call), as in Figure 1: the text so far (its last ``context``
        characters; None for all of it), then this iteration's accepted drafts, the rejected draft and the
        target's correction or bonus token, in ANSI colours or, without colour, with the kinds spelled out.
        ``color`` None (the default) colours when sys.stdout is a terminal and NO_COLOR is unset (use_color);
        True / False decide outright. ``prefix`` is the prompt's text; ``tokenizer`` overrides the trace's own.
        A hierarchical draft's iterations follow, indented and labelled "i.j", the iteration i they drafted
        for (``levels=False`` leaves them out)."""
        color = use_color(None, color)
        decode = self._decode if tokenizer is None else decode_function(tokenizer)
        lines = []
        for name, output, pieces in self._lines(decode, levels):
            shown = "".join(f"{_ANSI[kind]}{text}{_ANSI['reset']}" if color else f"[{kind}:{text}]"
                            for kind, text in pieces)
            so_far = _visible(prefix) + output
            tail = so_far if context is None or len(so_far) <= context else "\u2026" + so_far[-context:]
            indent = "    " * name.count(".")
            lines.append(f"{indent}{name:>3} | {tail}{shown}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = []
        for name, output, pieces in self._lines(self._decode):
            shown = "".join(f'<span style="{_CSS[kind]}">{html.escape(text)}</span>' for kind, text in pieces)
            indent = "&nbsp;" * (4 * name.count("."))
            rows.append(f"<div style='font-family:monospace;white-space:pre-wrap'>{indent}{name:>3} | "
                        f"{html.escape(output)}{shown}</div>")
        return "".join(rows)

    def __repr__(self) -> str:
        return f"speculant.Trace({len(self)} iterations)"
