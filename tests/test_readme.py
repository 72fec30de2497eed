"""Every ```python block of README.md and of the guide (docs/, in README's order) runs as written, in order and in
one namespace (as a reader pasting them into one session would), against the demo pair: its smoke-sized models
stand in for the trained ones, and the blocks' files go to a temporary directory."""

import re
import time
from pathlib import Path

import pytest

pytest.importorskip("pandas")
pytest.importorskip("matplotlib")
pytest.importorskip("transformers")
pytest.importorskip("distributed")  # "Sweeps on a cluster" starts a dask LocalCluster

from speculant import demo_pair  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def pages():
    """README.md, then the guide's pages in the order README's "The guide" links them."""
    guide = README.read_text().split("## The guide", 1)[1].split("\n## ", 1)[0]
    linked = re.findall(r"\]\((docs/[\w-]+\.md)\)", guide)
    return [README] + [ROOT / page for page in dict.fromkeys(linked)]


def test_the_guide_links_every_page():
    assert sorted(p.name for p in pages()[1:]) == sorted(p.name for p in (ROOT / "docs").glob("*.md"))


def python_blocks(text: str):
    """(first line number, source) of each ```python block."""
    return [(text.count("\n", 0, match.start(1)) + 1, match.group(1))
            for match in re.finditer(r"^```python\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)]


def test_python_blocks_are_found():
    blocks = python_blocks("text\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = 2\nz = 3\n```\n")
    assert blocks == [(3, "x = 1\n"), (9, "y = 2\nz = 3\n")]


# The sweep's timings of a few tokens on a shared machine are expected to be flagged; that warning is tested in
# test_sweep.py.
@pytest.mark.filterwarnings("ignore:.*settings are flagged:RuntimeWarning")
def test_readme_python_blocks_run(smoke_pair, tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setattr(demo_pair, "default_pair", lambda *args, **kwargs: smoke_pair)
    monkeypatch.chdir(tmp_path)
    blocks = [(page, line, source) for page in pages() for line, source in python_blocks(page.read_text())]
    assert len(blocks) >= 5
    namespace = {"__name__": "readme"}
    try:
        for page, line, source in blocks:
            # compiled under its file, each block's lines numbered as in the file, so a traceback points there
            start = time.perf_counter()
            exec(compile("\n" * (line - 1) + source, str(page), "exec"), namespace)
            print(f"{page.name} block at line {line}: {time.perf_counter() - start:.1f} s")
    finally:
        plt.close("all")
    assert namespace["frame"].attrs["repeats"] == 3 and namespace["check"].passed
    assert (tmp_path / "target.pt").is_file()
