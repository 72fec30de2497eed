"""scripts/run.sh, the README's two commands (issue 51): a first install says up front what it downloads and
shows pip's progress, `test` runs the suite on the newest torch and on the oldest supported one, and the README
tells how to use the environment it made. run.sh runs here against stand-in Python interpreters that log their
arguments, so nothing is installed."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()

STAND_IN = """#!/usr/bin/env bash
# a stand-in interpreter: logs its arguments (and its torch threads when it runs pytest); has torch only when
# {has_torch} is 1
echo "{name}: $*" >&2
case "$*" in *"-m pytest"*) echo "{name} threads: ${{OMP_NUM_THREADS:-unset}}" >&2 ;; esac
case "$*" in
  *"import torch; print"*) echo 2.99.0 ;;
  *"import torch"*) [ {has_torch} = 1 ] || exit 1 ;;
esac
exit 0
"""


def stand_in(directory: Path, name: str, has_torch: bool) -> Path:
    python = directory / name / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(STAND_IN.format(name=name, has_torch=int(has_torch)))
    python.chmod(0o755)
    return python.parent.parent


def run_script(tmp_path, *args, has_torch=False, oldest="torch==2.11.0"):
    env = {**os.environ, "SPECULANT_VENV": str(stand_in(tmp_path, "newest", has_torch)),
           "SPECULANT_OLDEST_VENV": str(stand_in(tmp_path, "oldest", has_torch)), "SPECULANT_OLDEST_TORCH": oldest}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "run.sh"), *args], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr.splitlines()


def test_a_first_install_says_what_it_downloads_and_shows_progress(tmp_path):
    lines = run_script(tmp_path, "test", "-x", has_torch=False)
    told = next(i for i, line in enumerate(lines) if "GB to download" in line and "minutes" in line)
    pip = [i for i, line in enumerate(lines) if line.startswith("newest: -m pip install") and "torch>=2.11" in line]
    assert pip and told < pip[0]
    assert "-q" not in lines[pip[0]].split() and "--progress-bar on" in lines[pip[0]]


def test_an_installed_environment_is_quiet(tmp_path):
    lines = run_script(tmp_path, "test", has_torch=True)
    assert not any("GB to download" in line for line in lines)
    (pip,) = [line for line in lines if line.startswith("newest: -m pip install") and "torch>=2.11" in line]
    assert "-q" in pip.split()


def test_the_test_command_runs_the_suite_on_both_torch_ends(tmp_path):
    """Both builds first, then the two suites side by side, one torch thread each, the oldest's output after the
    newest's."""
    lines = run_script(tmp_path, "test", "-x", has_torch=True)
    runs = [i for i, line in enumerate(lines) if "-m pytest tests -x" in line]
    assert [lines[i].split(":")[0] for i in runs] == ["newest", "oldest"]
    builds = [i for i, line in enumerate(lines) if "--no-build-isolation" in line]
    assert max(builds) < min(runs)
    assert [line for line in lines if " threads: " in line] == ["newest threads: 1", "oldest threads: 1"]
    assert any(line.startswith("oldest: -m pip install") and "torch==2.11.0" in line and "transformers==5.17.0" in line
               for line in lines)
    builds = [line for line in lines if "--no-build-isolation" in line]
    assert len(builds) == 2 and all("build-dir=build/torch-2.99.0" in line for line in builds)
    only_newest = run_script(tmp_path / "again", "test", has_torch=True, oldest="")
    assert [line.split(":")[0] for line in only_newest if "-m pytest" in line] == ["newest"]


def test_the_demo_says_how_to_use_its_environment(tmp_path):
    lines = run_script(tmp_path, "demo", "--gamma", "3", has_torch=True)
    assert any(re.search(r"source \S+/newest/bin/activate", line) for line in lines)
    assert lines[-1] == "newest: -m speculant demo --gamma 3"


def test_the_readme_gives_commands_that_work_for_someone_elses_environment():
    """README's first page: how to enter run.sh's environment, and how to install from the clone into one's
    own; never `pip install speculant[...]` from PyPI, where speculant is not published."""
    first_page = README[:README.index("\n## ", README.index("## Install"))] if "## Install" in README else ""
    assert "source ~/.cache/speculant/venv/bin/activate" in first_page
    assert "pip install --no-build-isolation '.[export]'" in first_page
    assert not re.search(r"pip install '?speculant\[", README)


def test_the_installed_command_answers(tmp_path):
    """`speculant --version` and `speculant --help` from the environment's own script, as a user runs them."""
    script = Path(sys.executable).parent / "speculant"
    if not script.exists():
        pytest.skip(f"speculant is not installed as a command beside {sys.executable} (an in-tree run)")
    version = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=120)
    assert version.returncode == 0 and re.match(r"speculant \d+\.\d+\.\d+ \(torch \S+\)", version.stdout)
    help_text = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120)
    assert help_text.returncode == 0 and "demo" in help_text.stdout
