"""Every ```python block of README.md and of the guide (docs/, in README's order) runs as written, in order and in
one namespace (as a reader pasting them into one session would), and each page's blocks run alone too, in a fresh
namespace (as a reader who opens that page first would), against the demo pair: its smoke-sized models stand in
for the trained ones, and the blocks' files go to a temporary directory."""

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


def test_the_guide_names_only_what_exists(smoke_pair):
    """A `Class.attribute` the pages cite for one of speculant's public classes is there to use (a Model's on a loaded
    model): batches.md cited `Model.batched`, which only the private extension has."""
    import speculant

    model = speculant.load(smoke_pair[0])
    cited = {(page.name, *match.groups()) for page in pages()
             for match in re.finditer(r"`([A-Z]\w*)\.([a-z_]\w*)", page.read_text())}
    public = [(page, name, attribute) for page, name, attribute in cited if name in speculant.__all__]
    assert len(public) >= 5
    missing = [(page, f"{name}.{attribute}") for page, name, attribute in sorted(public)
               if not hasattr(model if name == "Model" else getattr(speculant, name), attribute)]
    assert not missing


def test_python_blocks_are_found():
    blocks = python_blocks("text\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = 2\nz = 3\n```\n")
    assert blocks == [(3, "x = 1\n"), (9, "y = 2\nz = 3\n")]


@pytest.fixture
def docs_session(smoke_pair, tmp_path, monkeypatch):
    """What the blocks run in: the smoke pair behind demo_pair.default_pair(), tmp_path as the working directory,
    matplotlib drawing off screen (its figures closed after)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setattr(demo_pair, "default_pair", lambda *args, **kwargs: smoke_pair)
    monkeypatch.chdir(tmp_path)
    yield
    plt.close("all")


def run_blocks(blocks, namespace: dict) -> None:
    """Runs (page, first line, source) blocks in order in `namespace`, each compiled under its file with its lines
    numbered as in the file, so a traceback points there."""
    for page, line, source in blocks:
        start = time.perf_counter()
        exec(compile("\n" * (line - 1) + source, str(page), "exec"), namespace)
        print(f"{page.name} block at line {line}: {time.perf_counter() - start:.1f} s")


def test_readme_python_blocks_run(docs_session, tmp_path):
    blocks = [(page, line, source) for page in pages() for line, source in python_blocks(page.read_text())]
    assert len(blocks) >= 5
    namespace = {"__name__": "readme"}
    run_blocks(blocks, namespace)
    assert namespace["frame"].attrs["repeats"] == 3 and namespace["check"].passed
    assert (tmp_path / "target.pt").is_file()


@pytest.mark.parametrize("page", [page for page in pages() if python_blocks(page.read_text())],
                         ids=lambda page: page.name)
def test_each_page_runs_alone(page, docs_session):
    """A page's blocks, in a namespace of their own: every name a page uses, it defines (its imports and README's
    setup, in its first block)."""
    run_blocks([(page, line, source) for line, source in python_blocks(page.read_text())], {"__name__": "docs"})
