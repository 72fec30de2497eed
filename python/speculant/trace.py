"""The per-iteration trace of a generation, drawn like the paper's Figure 1: draft tokens the target accepted
(green), the rejected draft token (red; the drafts after it are discarded unseen) and the target's correction
(blue) or, when all gamma were accepted, its bonus token (blue, underlined)."""

from __future__ import annotations

import html
from typing import Callable, List, Optional, Sequence

from ._core import Iteration

Decode = Callable[[List[int]], str]

_ANSI = {"accepted": "\033[32m", "rejected": "\033[31;9m", "correction": "\033[34m", "bonus": "\033[34;4m",
         "reset": "\033[0m"}
_CSS = {"accepted": "color:#1a7f37", "rejected": "color:#cf222e;text-decoration:line-through",
        "correction": "color:#0969da", "bonus": "color:#0969da;text-decoration:underline"}


def _segments(it: Iteration) -> List[tuple]:
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


class Trace(Sequence[Iteration]):
    """A sequence of speculant.Iteration with terminal (``render``) and Jupyter (``_repr_html_``) views."""

    def __init__(self, iterations: Sequence[Iteration], decode: Optional[Decode] = None):
        self._iterations = list(iterations)
        self.decode = decode

    def __getitem__(self, index):
        return self._iterations[index]

    def __len__(self) -> int:
        return len(self._iterations)

    def with_decoder(self, decode: Decode) -> "Trace":
        """The same trace, rendering tokens through ``decode`` (a tokenizer's ids -> text)."""
        return Trace(self._iterations, decode)

    def _text(self, tokens: List[int]) -> str:
        """Tokens as one line of text: decoded when a decoder is set, with newlines and tabs made visible."""
        text = self.decode(tokens) if self.decode else " ".join(map(str, tokens)) + " "
        return text.replace("\n", "\u21b5").replace("\t", "\u2192").replace("\r", "")

    def render(self, color: bool = True, prefix: str = "", context: Optional[int] = 60) -> str:
        """One line per iteration (one target call), as in Figure 1: the text so far (its last ``context``
        characters; None for all of it), then this iteration's accepted drafts, the rejected draft and the
        target's correction or bonus token. Without colour the kinds are spelled out."""
        lines, so_far = [], prefix.replace("\n", "\u21b5")
        for i, it in enumerate(self._iterations):
            shown = ""
            for kind, tokens in _segments(it):
                text = self._text(tokens)
                shown += f"{_ANSI[kind]}{text}{_ANSI['reset']}" if color else f"[{kind}:{text}]"
            tail = so_far if context is None or len(so_far) <= context else "\u2026" + so_far[-context:]
            lines.append(f"{i + 1:>3} | {tail}{shown}")
            so_far += self._text(_emitted(it))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows, so_far = [], ""
        for it in self._iterations:
            shown = "".join(f'<span style="{_CSS[kind]}">{html.escape(self._text(tokens))}</span>'
                            for kind, tokens in _segments(it))
            rows.append(f"<div style='font-family:monospace;white-space:pre-wrap'>{html.escape(so_far)}"
                        f"{shown}</div>")
            so_far += self._text(_emitted(it))
        return "".join(rows)

    def __repr__(self) -> str:
        return f"speculant.Trace({len(self)} iterations)"
