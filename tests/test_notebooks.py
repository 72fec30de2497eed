"""The notebooks in notebooks/ run from top to bottom (nbclient, a kernel on this same Python) on the shipped demo
pair (converted into a temporary cache). They are stored
either without outputs or with the outputs of one complete run, top to bottom without an error: quickstart and
sweeps ship the outputs of a full run on the trained pair, made in notebooks/ with the venv's kernel by
`jupyter execute --inplace --kernel_name=python3 quickstart.ipynb sweeps.ipynb`."""

import json
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")
pytest.importorskip("pandas")

import speculant  # noqa: E402

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT = 300  # seconds; every notebook takes well under a minute on 2 cores


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """A kernelspec that runs this interpreter, and the environment its kernels get: the package found the way
    this process finds it (source tree or installed), the demo pair's files in a temporary cache."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / "speculant-tests"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "speculant tests", "language": "python"}))
    package_parent = str(Path(speculant.__file__).resolve().parent.parent)
    return {
        "JUPYTER_PATH": str(root), "JUPYTER_PLATFORM_DIRS": "1", "IPYTHONDIR": str(root / "ipython"),
        "PYTHONPATH": os.pathsep.join(p for p in (package_parent, os.environ.get("PYTHONPATH")) if p),
        "SPECULANT_CACHE": str(root / "cache"),
        "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1",
    }


def test_there_are_three_notebooks():
    assert [p.name for p in NOTEBOOKS] == ["paper_tables.ipynb", "quickstart.ipynb", "sweeps.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path, kernel_env, tmp_path, monkeypatch):
    notebook = nbformat.read(path, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    counts = [cell.execution_count for cell in code]
    stored = [out for cell in code for out in cell.outputs]
    if counts != list(range(1, len(code) + 1)):  # not one complete run: then no outputs at all
        assert not stored and all(c is None for c in counts), "store it without outputs or after a complete run"
    assert not any(out.output_type == "error" for out in stored), "the stored run has an error"
    for cell in code:  # the run below starts from nothing
        cell.outputs, cell.execution_count = [], None
    assert not any("speculant._" in cell.source for cell in code), "notebooks use the public package only"
    for name, value in kernel_env.items():
        monkeypatch.setenv(name, value)
    client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT, kernel_name="speculant-tests",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, with the cell and its traceback, when a cell fails
    errors = [out for cell in code for out in cell.outputs if out.output_type == "error"]
    assert not errors
