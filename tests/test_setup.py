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
# a stand-in interpreter: logs its arguments (and its torch threads when it runs pytest) to stderr and to
# $STAND_IN_LOG; has torch only when {has_torch} is 1. As the build (pip's --no-build-isolation install) it
# prints what a Ninja build prints under $NINJA_STATUS, and fails when $STAND_IN_BUILD_FAILS is set.
echo "{name}: $*" >&2
echo "{name}: $*" >> "$STAND_IN_LOG"
case "$*" in *"-m pytest"*) echo "{name} threads: ${{OMP_NUM_THREADS:-unset}}" >&2 ;; esac
case "$*" in
  *"import torch; print"*) echo 2.99.0 ;;
  *"import torch"*) [ {has_torch} = 1 ] || exit 1 ;;
  *"--no-build-isolation"*)
    echo "-- Configuring done"
    # ninja's own status is "[%f/%t] "; run.sh asks for the elapsed seconds too; pip indents it by 2
    if [ "${{NINJA_STATUS:-}}" = "[%f/%t %es] " ]; then one="[1/2 61.250s]" two="[2/2 95.500s]"; else one="[1/2]" two="[2/2]"; fi
    echo "  $one Building CXX object CMakeFiles/_core.dir/cpp/loop/batch.cpp.o"
    if [ -n "${{STAND_IN_BUILD_FAILS:-}}" ]; then echo "cpp/loop/batch.cpp:1: error: expected ';'"; exit 1; fi
    echo "  $two Linking CXX shared module _core.cpython-311-x86_64-linux-gnu.so" ;;
esac
exit 0
"""


def stand_in(directory: Path, name: str, has_torch: bool) -> Path:
    python = directory / name / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(STAND_IN.format(name=name, has_torch=int(has_torch)))
    python.chmod(0o755)
    return python.parent.parent


def run_script(tmp_path, *args, has_torch=False, oldest="torch==2.11.0", fails=False, env=None):
    """run.sh's stderr lines (what the user sees); the stand-ins' calls are in tmp_path / "calls.log"."""
    env = {**os.environ, "SPECULANT_VENV": str(stand_in(tmp_path, "newest", has_torch)),
           "SPECULANT_OLDEST_VENV": str(stand_in(tmp_path, "oldest", has_torch)), "SPECULANT_OLDEST_TORCH": oldest,
           "STAND_IN_LOG": str(tmp_path / "calls.log"), **(env or {})}
    done = subprocess.run(["bash", str(ROOT / "scripts" / "run.sh"), *args], env=env, capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode != 0) == fails, done.stderr
    return done.stderr.splitlines()


def calls(tmp_path):
    """The stand-ins' calls in order, the build's among them (whose own output run.sh filters)."""
    return (tmp_path / "calls.log").read_text().splitlines()


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
    run_script(tmp_path, "test", "-x", has_torch=True)
    lines = calls(tmp_path)
    runs = [i for i, line in enumerate(lines) if "-m pytest tests -x" in line]
    assert sorted(lines[i].split(":")[0] for i in runs) == ["newest", "oldest"]  # side by side: either starts first
    builds = [i for i, line in enumerate(lines) if "--no-build-isolation" in line]
    assert max(builds) < min(runs)
    shown = run_script(tmp_path / "shown", "test", "-x", has_torch=True)
    assert [line for line in shown if " threads: " in line] == ["newest threads: 1", "oldest threads: 1"]
    assert any(line.startswith("oldest: -m pip install") and "torch==2.11.0" in line and "transformers==5.17.0" in line
               for line in lines)
    builds = [line for line in lines if "--no-build-isolation" in line]
    assert len(builds) == 2 and all("build-dir=build/torch-2.99.0" in line for line in builds)
    only_newest = run_script(tmp_path / "again", "test", has_torch=True, oldest="")
    assert [line.split(":")[0] for line in only_newest if "-m pytest" in line] == ["newest"]


def test_the_build_shows_its_progress_and_its_errors(tmp_path):
    """Issue 67: the C++ build was silent for its whole 10 minutes. Now each compile step ninja finishes is a
    line (steps done of the total, seconds since the build started, the file); a failed build prints the end of
    its log and where the whole log is, and run.sh fails with it."""
    lines = run_script(tmp_path, "demo", has_torch=True)
    steps = [line for line in lines if line.startswith("speculant build: ")]
    assert steps == ["speculant build: 1/2 steps, 61 s, cpp/loop/batch.cpp",
                     "speculant build: 2/2 steps, 95 s, _core.cpython-311-x86_64-linux-gnu.so"]
    assert not any("Configuring done" in line for line in lines)  # the rest stays in the log
    failed = run_script(tmp_path / "failed", "demo", has_torch=True, fails=True, env={"STAND_IN_BUILD_FAILS": "1"})
    assert any(line.startswith("speculant setup: the build failed (exit 1)") and "the whole log is" in line
               for line in failed)
    assert "cpp/loop/batch.cpp:1: error: expected ';'" in failed and "-- Configuring done" in failed
    assert not any("-m speculant demo" in line for line in calls(tmp_path / "failed"))


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
