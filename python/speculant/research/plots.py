"""Plots of the paper's analysis and of sweeps (matplotlib). Each function draws on ``ax`` (a new figure when
None) and returns the Axes; ``ax.figure`` is its Figure.

Sweep plots take the DataFrame of ``speculant.sweep`` (or any frame with the columns they name, such as the
paper's own tables) and draw one line per combination of the settings that vary in it, other than the x axis.
Token-tree rows (a ``tree`` shape, sweep's trees=) are drawn as square markers at their depth, apart from the
chains' lines.

What a sweep flags is drawn so (its ``flag`` column, speculant.timing): a row flagged "impossible" (its timing
broken) is never drawn as a measurement, only as a red cross on the axis at its gamma; a row with any other
flag ("contended", "noisy", "off theory") is drawn with a black ring around its point. The y axis is fitted to
the medians and predictions, so that error bars (the rounds' range) cannot swamp the figure: a bar longer than
the axes is cut at their edge. Gamma ticks are integers.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import MaxNLocator

from . import analysis

SETTINGS = ["gamma", "verification", "temperature", "top_k", "top_p", "lenience"]
_NAMES = {"gamma": "\u03b3", "verification": "verification", "temperature": "T", "top_k": "top-k", "top_p": "top-p",
          "lenience": "l"}
SPEEDUP_LABEL = "speedup over plain decoding (\u00d7, wall time per token)"
GAMMA_LABEL = "\u03b3 (draft tokens per iteration)"
FLAGGED_LABEL = "flagged timing (contended, noisy or off theory)"
IMPOSSIBLE_LABEL = "impossible timing (not drawn as a measurement)"


def _axes(ax: Optional[Axes]) -> Axes:
    """``ax``, or a new figure's (constrained layout: room for outside legends), in the plots' one style."""
    ax = plt.subplots(layout="constrained")[1] if ax is None else ax
    ax.grid(True, color="0.9", linewidth=0.8)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return ax


def _flags(rows) -> np.ndarray:
    """Each row's flag text ("" without a flag column or for a row without a flag)."""
    if "flag" not in rows.columns:
        return np.full(len(rows), "", dtype=object)
    return np.array([f if isinstance(f, str) else "" for f in rows.flag], dtype=object)


def _impossible(rows) -> np.ndarray:
    return np.array(["impossible" in f for f in _flags(rows)], dtype=bool)


def _mark_flags(ax: Axes, x, rows) -> None:
    """A black ring around each drawn point whose row carries a flag (one legend entry for all of them)."""
    flagged = np.array([bool(f) for f in _flags(rows)], dtype=bool)
    if flagged.any():
        label = "_" + FLAGGED_LABEL if _has_label(ax, FLAGGED_LABEL) else FLAGGED_LABEL
        ax.plot(np.asarray(x)[flagged], rows.speedup.to_numpy(float)[flagged], "o", markersize=13,
                markerfacecolor="none", markeredgecolor="black", markeredgewidth=1.2, label=label)


def _mark_impossible(ax: Axes, x) -> None:
    """Red crosses on the x axis at the positions of rows whose timing was impossible."""
    if len(x):
        label = "_" + IMPOSSIBLE_LABEL if _has_label(ax, IMPOSSIBLE_LABEL) else IMPOSSIBLE_LABEL
        ax.plot(x, np.full(len(x), 0.03), "x", color="red", markersize=9, markeredgewidth=2,
                transform=ax.get_xaxis_transform(), clip_on=False, label=label)


def _has_label(ax: Axes, label: str) -> bool:
    return any(line.get_label() == label for line in ax.get_lines())


def _fit_y(ax: Axes, values) -> None:
    """The y axis over the central values (medians, predictions, 1 = plain decoding), with a margin: error bars
    beyond it are cut at the axes' edge instead of setting its scale."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if values.size:
        low, high = min(values.min(), 1.0), max(values.max(), 1.0)
        pad = 0.15 * (high - low) or 0.1 * high
        ax.set_ylim(max(0.0, low - pad), high + pad)


def _groups(frame, x: str, by: Optional[Sequence[str]]) -> List[tuple]:
    """(label, rows sorted by x) per combination of the ``by`` columns; by default the settings other than x
    that take more than one value in the frame."""
    if by is None:
        by = [c for c in SETTINGS if c != x and c in frame.columns and frame[c].nunique() > 1]
    by = [by] if isinstance(by, str) else list(by)
    if not by:
        return [(None, frame.sort_values(x))]
    groups = []
    for key, rows in frame.groupby(by, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        label = ", ".join(f"{_NAMES.get(name, name)} = {value}" for name, value in zip(by, key))
        groups.append((label, rows.sort_values(x)))
    return groups


def _split(frame) -> tuple:
    """(chain rows, token-tree rows) of a sweep frame (trees: a shape in the ``tree`` column)."""
    if "tree" not in frame.columns:
        return frame, frame.iloc[:0]
    trees = frame.tree.notna()
    return frame[~trees], frame[trees]


def _shape(tree) -> str:
    if not isinstance(tree, Sequence):  # a DynamicTree
        return f"grown {tree.budget}"
    return "[" + ", ".join(str(int(k)) for k in tree) + "]"


def _legend(ax: Axes) -> None:
    if any(not line.get_label().startswith("_") for line in ax.get_lines()):
        ax.legend()


def _spread(ax: Axes, x, rows, color) -> None:
    """Error bars from the lowest to the highest speedup of the timed rounds (speculant.sweep's columns)."""
    if {"speedup_min", "speedup_max"} <= set(rows.columns):
        below = (rows.speedup - rows.speedup_min).to_numpy(float)
        above = (rows.speedup_max - rows.speedup).to_numpy(float)
        ax.errorbar(x, rows.speedup, yerr=[below, above], fmt="none", ecolor=color, capsize=3)


def speedup_vs_gamma(frame, *, by: Optional[Sequence[str]] = None, predicted: bool = True,
                     ax: Optional[Axes] = None) -> Axes:
    """Measured speedup over plain decoding against gamma (solid, one line per setting, e.g. per temperature,
    with error bars over the sweep's timed rounds) and, with ``predicted``, Theorem 3.8's prediction from the
    measured alpha and c (dashed, same colour). Flagged rows as the module docstring says."""
    ax = _axes(ax)
    chains, trees = _split(frame)
    central = []
    for label, rows in (_groups(chains, "gamma", by) if len(chains) else []):
        bad = _impossible(rows)
        kept = rows[~bad]
        (line,) = ax.plot(kept.gamma, kept.speedup, "o-", label=label or "measured")
        _spread(ax, kept.gamma, kept, line.get_color())
        _mark_flags(ax, kept.gamma, kept)
        _mark_impossible(ax, rows.gamma[bad])
        central += kept.speedup.tolist()
        if predicted:
            ax.plot(rows.gamma, rows.predicted_speedup, "--", color=line.get_color(),
                    label=f"{label}: Theorem 3.8" if label else "Theorem 3.8")
            central += rows.predicted_speedup.tolist()
    central += _tree_points(ax, trees, by, predicted)
    ax.axhline(1.0, color="grey", linewidth=0.8, label="_plain decoding")
    ax.set(xlabel=GAMMA_LABEL, ylabel=SPEEDUP_LABEL, title="Speedup vs \u03b3")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _fit_y(ax, central)
    _legend(ax)
    return ax


def _tree_points(ax: Axes, trees, by, predicted: bool) -> list:
    """speedup_vs_gamma's token trees: one marker per tree at its depth, its prediction hollow beside it.
    Returns the central values drawn."""
    several = "siblings" in trees.columns and trees.siblings.nunique() > 1  # name the way when it varies
    central = []
    for label, rows in (_groups(trees, "gamma", by) if len(trees) else []):
        for index, row in rows.iterrows():
            name = (f"tree {_shape(row.tree)}" + (f" {row.siblings}" if several else "")
                    + (" + sibling draft" if row.get("sibling_draft") is True else "")
                    + (f", {label}" if label else ""))
            one = rows.loc[[index]]
            if _impossible(one).any():
                _mark_impossible(ax, [row.gamma])
            else:
                (point,) = ax.plot([row.gamma], [row.speedup], "s", label=name)
                _spread(ax, [row.gamma], one, point.get_color())
                _mark_flags(ax, [row.gamma], one)
                central.append(row.speedup)
            if predicted:
                ax.plot([row.gamma], [row.predicted_speedup], "s", markerfacecolor="none",
                        color=ax.get_lines()[-1].get_color(), label=f"{name}: tree theory")
                central.append(row.predicted_speedup)
    return central


def alpha_vs_lenience(frame, *, by: Optional[Sequence[str]] = None, ax: Optional[Axes] = None) -> Axes:
    """The ``acceptance`` column against lenience (A.5), one line per setting, averaged over gamma: the paper's
    Table 5 as a picture. The axis says "acceptance rate", not alpha: alpha is the expected acceptance E[beta] of
    the exact rule (Corollary 3.6), which the column holds at lenience 1 only; below 1 it holds the measured
    fraction of verified drafts that were kept."""
    ax = _axes(ax)
    if by is None:
        by = [c for c in SETTINGS if c not in ("lenience", "gamma") and c in frame.columns and frame[c].nunique() > 1]
    for label, rows in _groups(frame, "lenience", by):
        mean = rows.groupby("lenience", sort=True).acceptance.mean()
        ax.plot(mean.index, mean.to_numpy(), "o-", label=label)
    ax.set(xlabel="lenience l (1 = exact; below 1 the output law moves, A.5)",
           ylabel="acceptance rate (\u03b1 at l = 1)", title="Acceptance rate vs lenience (A.5)")
    ax.invert_xaxis()  # from exact (l = 1) to most lenient, as Table 5 reads
    _legend(ax)
    return ax


def predicted_vs_measured(frame, *, by: Optional[Sequence[str]] = None, ax: Optional[Axes] = None) -> Axes:
    """Measured speedup (``speedup``) against Theorem 3.8's prediction (``predicted_speedup``) and the diagonal
    where they agree: the paper's Table 4 as a picture. One colour per setting (by default the settings other
    than gamma that vary in the frame), each point drawn as its gamma (a digit marker: no text labels to
    overlap), with the timed rounds' range as error bars; the legend stands outside the axes, on the right."""
    ax = _axes(ax)
    if by is None:
        by = [c for c in SETTINGS if c != "gamma" and c in frame.columns and frame[c].nunique() > 1]
    bad = _impossible(frame)
    _mark_impossible(ax, frame.predicted_speedup[bad])
    chains, trees = _split(frame[~bad])
    for label, rows in (_groups(chains, "predicted_speedup", by) if len(chains) else []):
        (handle,) = ax.plot(rows.predicted_speedup, rows.speedup, "o", markersize=14, alpha=0.25,
                            label=label or "measured")
        color = handle.get_color()
        _spread(ax, rows.predicted_speedup, rows, color)
        _mark_flags(ax, rows.predicted_speedup, rows)
        if "gamma" in rows.columns:
            for gamma, points in rows.groupby("gamma", sort=True):
                ax.plot(points.predicted_speedup, points.speedup, linestyle="none", marker=f"${gamma}$",
                        markersize=6 + 2 * len(str(gamma)), color=color, label=f"_\u03b3 = {gamma}")
    for label, rows in (_groups(trees, "predicted_speedup", by) if len(trees) else []):
        (handle,) = ax.plot(rows.predicted_speedup, rows.speedup, "s", label=f"trees, {label}" if label else "trees")
        _spread(ax, rows.predicted_speedup, rows, handle.get_color())
        _mark_flags(ax, rows.predicted_speedup, rows)
    drawn = frame[~bad]
    values = np.concatenate([drawn.predicted_speedup.to_numpy(float), drawn.speedup.to_numpy(float)])
    values = values[np.isfinite(values)]
    low, high = (values.min(), values.max()) if values.size else (0.0, 1.0)
    ax.plot([low, high], [low, high], color="grey", linewidth=0.8, label="measured = predicted")
    ax.set(xlabel="predicted speedup (\u00d7, Theorem 3.8)", ylabel="measured " + SPEEDUP_LABEL,
           title="Predicted vs measured")
    _fit_y(ax, values)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize="small",
              title="points: \u03b3" if "gamma" in frame.columns else None, title_fontsize="small")
    return ax


def expected_tokens_vs_alpha(gammas: Sequence[int] = (1, 2, 3, 5, 7, 10), *,
                             alphas: Optional[np.ndarray] = None, ax: Optional[Axes] = None) -> Axes:
    """Figure 2: Equation (1), the expected tokens per run of Algorithm 1, against alpha for several gamma."""
    ax = _axes(ax)
    alphas = np.linspace(0.0, 1.0, 101) if alphas is None else np.asarray(alphas)
    for gamma in gammas:
        ax.plot(alphas, analysis.expected_tokens(alphas, gamma), label=f"\u03b3 = {gamma}")
    ax.set(xlabel="\u03b1", ylabel="expected tokens per iteration (per target call)", title="Equation (1) (Figure 2)")
    _legend(ax)
    return ax


def optimal_gamma_vs_alpha(costs: Sequence[float] = (0.01, 0.02, 0.05, 0.1), *,
                           alphas: Optional[np.ndarray] = None, max_gamma: int = 64,
                           ax: Optional[Axes] = None) -> Axes:
    """Figure 3: the gamma that maximizes Theorem 3.8 (§3.5) against alpha for several cost coefficients c."""
    ax = _axes(ax)
    alphas = np.linspace(0.0, 0.95, 96) if alphas is None else np.asarray(alphas)
    for c in costs:
        ax.plot(alphas, analysis.optimal_gamma(alphas, c, max_gamma), drawstyle="steps-post", label=f"c = {c}")
    ax.set(xlabel="\u03b1", ylabel="optimal \u03b3 (draft tokens per iteration)",
           title="Optimal \u03b3 (\u00a73.5, Figure 3)")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    _legend(ax)
    return ax
