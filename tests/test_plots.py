"""speculant.plots draws the data it is given: lines and points checked against the frame or the formulas."""

import importlib

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from speculant import analysis, plots  # noqa: E402

COLUMNS = importlib.import_module("speculant.sweep").COLUMNS


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def frame():
    """A sweep-shaped frame: gamma 1..3 x temperature 0 / 1 x lenience 1 / 0.5, made-up measurements."""
    rows = []
    for t in (0.0, 1.0):
        for l in (1.0, 0.5):
            for g in (3, 1, 2):  # unsorted on purpose
                rows.append({**dict.fromkeys(COLUMNS, 0.0), "tree": None, "gamma": g, "temperature": t, "top_k": 0,
                             "top_p": 1.0,
                             "lenience": l, "acceptance": 0.5 + 0.3 * t + (1 - l) * 0.2 + 0.01 * g,
                             "speedup": 1 + g * (1 + t) / 10 + l, "predicted_speedup": 1.5 + g / 10 + t + l})
                rows[-1].update(speedup_min=rows[-1]["speedup"] - 0.1, speedup_max=rows[-1]["speedup"] + 0.2)
    return pd.DataFrame(rows, columns=COLUMNS)


def line(ax, label):
    (found,) = [l for l in ax.get_lines() if l.get_label() == label]
    return found.get_xdata().tolist(), found.get_ydata().tolist()


def test_speedup_vs_gamma():
    data = frame()
    ax = plots.speedup_vs_gamma(data)
    assert ax.get_xlabel().startswith("\u03b3")
    rows = data[(data.temperature == 1.0) & (data.lenience == 0.5)].sort_values("gamma")
    assert line(ax, "T = 1.0, l = 0.5") == (rows.gamma.tolist(), rows.speedup.tolist())
    assert line(ax, "T = 1.0, l = 0.5: Theorem 3.8")[1] == rows.predicted_speedup.tolist()
    assert len([l for l in ax.get_lines() if not l.get_label().startswith("_")]) == 8
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "T = 0.0, l = 1.0" in legend and "_plain decoding" not in legend
    one = plots.speedup_vs_gamma(data[(data.temperature == 0.0) & (data.lenience == 1.0)], predicted=False)
    assert line(one, "measured") == ([1, 2, 3], [2.1, 2.2, 2.3])
    # the rounds' range as error bars: one vertical segment per point, from speedup_min to speedup_max
    (bars,) = one.collections
    assert np.allclose([segment[:, 1] for segment in bars.get_segments()], [(2.0, 2.3), (2.1, 2.4), (2.2, 2.5)])


def test_trees_are_squares_beside_the_chains():
    data = frame()
    chains = data[data.lenience == 1.0]
    trees = pd.DataFrame([{**dict.fromkeys(COLUMNS, 0.0), "tree": (2, 2), "gamma": 2, "temperature": t, "top_k": 0,
                           "top_p": 1.0, "lenience": 1.0, "speedup": 2.5 + t, "speedup_min": 2.4 + t,
                           "speedup_max": 2.6 + t, "predicted_speedup": 2.7 + t} for t in (0.0, 1.0)], columns=COLUMNS)
    both = pd.concat([chains, trees], ignore_index=True)
    ax = plots.speedup_vs_gamma(both)
    rows = chains[chains.temperature == 1.0].sort_values("gamma")
    assert line(ax, "T = 1.0") == (rows.gamma.tolist(), rows.speedup.tolist())  # the chains' line, trees apart
    assert line(ax, "tree [2, 2], T = 1.0") == ([2], [3.5])
    assert line(ax, "tree [2, 2], T = 1.0: tree theory") == ([2], [3.7])
    scatter = plots.predicted_vs_measured(both)
    assert line(scatter, "trees, T = 0.0") == ([2.7], [2.5])


def test_alpha_vs_lenience_averages_over_gamma():
    ax = plots.alpha_vs_lenience(frame())
    x, y = line(ax, "T = 1.0")
    assert x == [0.5, 1.0] and y == pytest.approx([0.5 + 0.3 + 0.1 + 0.02, 0.5 + 0.3 + 0.02])
    assert ax.xaxis_inverted()
    paper = pd.DataFrame({"M_q": ["T5-small"] * 4, "lenience": [1, 0.5, 0.3, 0.1],
                          "acceptance": [0.62, 0.71, 0.76, 0.84]})  # Table 5
    assert line(plots.alpha_vs_lenience(paper, by="M_q"), "M_q = T5-small") == ([0.1, 0.3, 0.5, 1], [0.84, 0.76, 0.71, 0.62])


def test_alpha_vs_lenience_labels_the_acceptance_rate():
    """Issue 25: alpha is E[beta] of the exact rule (Corollary 3.6); below lenience 1 the column is the measured
    rate of kept drafts, so the axis names the acceptance rate, and alpha only where it is one (l = 1)."""
    ax = plots.alpha_vs_lenience(frame())
    assert ax.get_ylabel() == "acceptance rate (\u03b1 at l = 1)"
    assert ax.get_title() == "Acceptance rate vs lenience (A.5)"


def test_predicted_vs_measured():
    data = frame()
    ax = plots.predicted_vs_measured(data)
    rows = data[(data.temperature == 1.0) & (data.lenience == 0.5)].sort_values("predicted_speedup")
    assert line(ax, "T = 1.0, l = 0.5") == (rows.predicted_speedup.tolist(), rows.speedup.tolist())
    low = min(data.predicted_speedup.min(), data.speedup.min())
    high = max(data.predicted_speedup.max(), data.speedup.max())
    assert line(ax, "measured = predicted") == ([low, high], [low, high])
    # each point drawn as its gamma, in its setting's colour: (marker, x, y, colour) per point
    (setting,) = [l for l in ax.get_lines() if l.get_label() == "T = 1.0, l = 0.5"]
    drawn = sorted((l.get_marker(), x, y, l.get_color()) for l in ax.get_lines() if l.get_marker().startswith("$")
                   for x, y in zip(l.get_xdata(), l.get_ydata()))
    assert len(drawn) == len(data)
    assert [d[0] for d in drawn if d[3] == setting.get_color()] == ["$1$", "$2$", "$3$"]
    assert [d[1:3] for d in drawn if d[3] == setting.get_color()] == list(zip(rows.predicted_speedup, rows.speedup))


def test_predicted_vs_measured_labels_are_readable():
    """Issue 25: the gamma of each point was a text label beside it ("γ=3"), and a sweep's points overlap: the
    labels overprinted each other and the legend covered points. Now no text is drawn in the axes (the gamma is
    the marker), and the legend, short entries naming each setting, stands outside the axes."""
    ax = plots.predicted_vs_measured(frame())
    assert len(ax.texts) == 0
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [
        "T = 0.0, l = 0.5", "T = 0.0, l = 1.0", "T = 1.0, l = 0.5", "T = 1.0, l = 1.0", "measured = predicted"]
    assert legend.get_title().get_text() == "points: \u03b3"
    ax.figure.canvas.draw()
    renderer = ax.figure.canvas.get_renderer()
    box, axes_box = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
    assert box.x0 >= axes_box.x1  # beside the axes, covering nothing
    assert box.x1 <= ax.figure.bbox.x1 + 1  # and inside the figure (constrained layout)


def test_figures_2_and_3_plot_the_formulas():
    ax = plots.expected_tokens_vs_alpha((1, 5))
    x, y = line(ax, "\u03b3 = 5")
    assert y == pytest.approx(analysis.expected_tokens(np.array(x), 5).tolist())
    assert y[-1] == 6.0 and y[0] == 1.0
    fig, axes = plt.subplots(1, 2)
    assert plots.optimal_gamma_vs_alpha((0.01, 0.1), alphas=[0.5, 0.8, 0.9], ax=axes[1]) is axes[1]
    x, y = line(axes[1], "c = 0.1")
    assert y == [analysis.optimal_gamma(a, 0.1) for a in (0.5, 0.8, 0.9)]
    cheap = line(axes[1], "c = 0.01")[1]  # cheaper drafts: longer optimal drafts (Figure 3)
    assert all(a >= b for a, b in zip(cheap, y)) and cheap != y


def flagged_frame():
    """Chains at gamma 1..4: gamma 2 flagged "contended", gamma 4 "impossible" with a 17.5x speedup (the sweeps
    notebook's, more than gamma + 1 tokens per call allow) and error bars up to 43x."""
    data = frame()
    data = data[(data.temperature == 1.0) & (data.lenience == 1.0)].copy()
    data["flag"] = ["", "", "contended"]  # gammas 3, 1, 2 in the frame's order
    bad = {**data.iloc[0].to_dict(), "gamma": 4, "speedup": 17.5, "speedup_min": 1.36, "speedup_max": 43.2,
           "predicted_speedup": 3.0, "flag": "impossible, noisy"}
    return pd.concat([data, pd.DataFrame([bad])], ignore_index=True)


def test_flagged_rows_are_marked_and_impossible_ones_not_drawn_as_measurements():
    """Issue 67: a row flagged "impossible" is no measurement: it is left out of the measured line and drawn
    only as a red cross on the axis; rows with other flags carry a ring; the y axis is fitted to the medians and
    predictions (the 43x error bar is cut at its edge, not setting the scale); gamma ticks are integers; the
    axes say their units."""
    data = flagged_frame()
    for ax in (plots.speedup_vs_gamma(data), plots.predicted_vs_measured(data)):
        ax.figure.canvas.draw()
        assert all(17.5 not in l.get_ydata() for l in ax.get_lines())  # nowhere a measurement
        (crosses,) = [l for l in ax.get_lines() if l.get_label() == plots.IMPOSSIBLE_LABEL]
        assert crosses.get_marker() == "x" and crosses.get_color() == "red"
        (rings,) = [l for l in ax.get_lines() if l.get_label() == plots.FLAGGED_LABEL]
        assert rings.get_markerfacecolor() == "none" and len(rings.get_ydata()) == 1
        assert ax.get_ylim()[1] < 5  # the medians and predictions reach 3.8, the cut bar 43.2
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert plots.IMPOSSIBLE_LABEL in legend and plots.FLAGGED_LABEL in legend
        assert "\u00d7" in ax.get_ylabel()
    ax = plots.speedup_vs_gamma(data)
    assert line(ax, "measured") == ([1, 2, 3], [2.2, 2.4, 2.6])
    (crosses,) = [l for l in ax.get_lines() if l.get_label() == plots.IMPOSSIBLE_LABEL]
    assert crosses.get_xdata().tolist() == [4]
    (rings,) = [l for l in ax.get_lines() if l.get_label() == plots.FLAGGED_LABEL]
    assert (rings.get_xdata().tolist(), rings.get_ydata().tolist()) == ([2], [2.4])
    ax.figure.canvas.draw()
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks  # not 1.5 and 2.5
    assert ax.get_xlabel() == "\u03b3 (draft tokens per iteration)"


def test_every_plot_has_the_same_style():
    axes = [plots.speedup_vs_gamma(frame()), plots.alpha_vs_lenience(frame()), plots.predicted_vs_measured(frame()),
            plots.expected_tokens_vs_alpha(), plots.optimal_gamma_vs_alpha()]
    for ax in axes:
        assert not ax.spines["top"].get_visible() and not ax.spines["right"].get_visible()
        assert any(line.get_visible() for line in ax.get_xgridlines())
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
