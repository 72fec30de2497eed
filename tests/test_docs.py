"""README.md against what stands behind it: the figures it quotes for the .pt2 and live transformers backends are
BENCHMARKS.md's (issue 25: README kept older ones), and what it says the defaults are is what the code has."""

import inspect
import re
from pathlib import Path

import speculant

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
CUDA_GRAPHS = (ROOT / "docs" / "cuda-graphs.md").read_text(encoding="utf-8")
BENCHMARKS = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")


def section(text: str, heading: str) -> str:
    """The text under the first heading that starts with `heading`, up to the next heading of its level or above."""
    match = re.search(rf"^(#+) {re.escape(heading)}.*$", text, flags=re.MULTILINE)
    assert match, f"no heading {heading!r}"
    level = len(match.group(1))
    end = re.compile(rf"^#{{1,{level}}} ", flags=re.MULTILINE).search(text, match.end())
    return text[match.end(): end.start() if end else len(text)]


def figures(text: str) -> set:
    """The decimal figures of `text` (1.36, 0.83, 105.5), versions such as 2.15.0 left out."""
    return set(re.findall(r"(?<![\d.])\d+\.\d+(?![\d.])", text))


def test_backend_figures_in_readme_are_benchmarks_figures():
    backends = section(BENCHMARKS, "Model backends side by side")
    paragraphs = [p for p in section(README, "Benchmarks").split("\n\n") if ".pt2" in p or "live" in p]
    assert paragraphs, "README's Benchmarks section no longer mentions the .pt2 or live backends"
    for paragraph in paragraphs:
        quoted = figures(paragraph)
        assert quoted <= figures(backends), (quoted - figures(backends), paragraph)
        if quoted:
            assert "BENCHMARKS.md" in paragraph and "2-core" in paragraph, paragraph  # where and on what machine


def test_readme_states_the_cuda_graphs_default():
    graphs = CUDA_GRAPHS
    default = inspect.signature(speculant.SpeculativeDecoder).parameters["cuda_graphs"].default
    assert f'`cuda_graphs="{default}"` is the default' in graphs
    assert "# the default" not in graphs.split("```")[1]  # the example passes "auto": it must not claim the default
