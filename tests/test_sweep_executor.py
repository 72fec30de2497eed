"""speculant.sweep(..., executor=): settings as tasks on a process pool, a dask LocalCluster and (when installed)
Ray, with the same tokens, alpha and counts as the serial sweep; failed tasks and dead workers reported, not
dropped; models that cannot travel refused before anything runs; the workers' model cache."""

import concurrent.futures
import importlib
import multiprocessing
import os
import time

import pytest
import torch

from support import markov
from support.reference import one_hot
import speculant
from speculant import drafters, workers

sweep_module = importlib.import_module("speculant.sweep")  # the module; speculant.sweep is the function
VOCAB = 6
PROMPTS = [[1, 2], [3], [0, 1, 2]]
TIMES = ["seconds", "plain_seconds", "c", "speedup", "speedup_min", "speedup_max", "spread", "predicted_speedup",
         "cost_model_speedup", "flag", "speedup_bound", "cpu_share"]
EXACT = [c for c in sweep_module.COLUMNS if c not in TIMES]  # the setting, alpha, counts: fixed by the seed


def short_continuations(context, gamma):
    """A Python drafter with a bug that shows only at gamma > 4: it keeps 4-token continuations and indexes
    past them (IndexError) when asked for more. Module-level, so that workers import it by name."""
    row = [(context[-1] + i + 1) % VOCAB for i in range(4)]
    tokens = [row[i] for i in range(gamma)]
    return tokens, one_hot(tokens, VOCAB)  # [k, V]


def die():
    os._exit(3)  # a worker killed mid-task (out of memory, a segfault in native code, a preempted node)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(target path, draft path): the Markov pair of tests/test_sweep.py as TorchScript files."""
    folder = tmp_path_factory.mktemp("executor_pair")
    target, draft = markov.target_and_draft(VOCAB, 3, draft_scale=1.0)
    paths = folder / "target.pt", folder / "draft.pt"
    for table, path in zip((target, draft), paths):
        torch.jit.save(markov.cached_model(table), str(path))
    return tuple(str(p) for p in paths)


@pytest.fixture(scope="module")
def pair(files):
    return tuple(speculant.load(path) for path in files)


@pytest.fixture(scope="module")
def pool():
    """Two spawned worker processes (a fresh interpreter each, as on a cluster), one torch thread each."""
    with concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn"),
                                                initializer=torch.set_num_threads, initargs=(1,)) as executor:
        yield executor


GRID = dict(gammas=[1, 3], temperatures=[0.0, 0.8], top_k=[0, 3], max_new_tokens=12, seed=7, repeats=1,
            progress=False)


def test_process_pool_gives_the_serial_numbers(pair, pool):
    serial = speculant.sweep(*pair, PROMPTS, **GRID)
    frame = speculant.sweep(*pair, PROMPTS, **GRID, executor=pool)
    assert len(frame) == 8 and frame.attrs["failed"] == [] and not frame.attrs["interrupted"]
    assert frame[EXACT].equals(serial[EXACT])  # rows in grid order, whatever order the tasks finished in
    assert (frame.seconds > 0).all() and frame.speedup.notna().all()


def test_drafters_travel_as_their_arguments(pair, pool):
    corpus = torch.randint(0, VOCAB, (400,), generator=torch.Generator().manual_seed(0))
    kinds = [drafters.Bigram.fit(corpus, VOCAB), drafters.Unigram.fit(corpus, VOCAB),
             drafters.PromptLookup(VOCAB, min_ngram=1, max_ngram=2), drafters.PythonDrafter(short_continuations, VOCAB)]
    grid = dict(GRID, gammas=[2], temperatures=[0.0, 0.8], top_k=0)
    for drafter in kinds:
        serial = speculant.sweep(pair[0], drafter, PROMPTS, **grid)
        frame = speculant.sweep(pair[0], drafter, PROMPTS, **grid, executor=pool)
        assert frame[EXACT].equals(serial[EXACT]), type(drafter).__name__


def test_a_sibling_draft_travels_as_its_file(pool, tmp_path):
    """sweep(sibling_draft=) on a process pool: the sibling goes as its file, loaded in each worker under a role
    of its own, and the tree rows give the serial sweep's tokens, alpha and counts."""
    from support.engine_checks import MarkovRows
    tables = (*markov.target_and_draft(VOCAB, 3, draft_scale=1.0), markov.target_and_draft(VOCAB, 103)[1])
    paths = [str(tmp_path / f"{name}.pt") for name in ("target", "draft", "sibling")]
    for table, path in zip(tables, paths):
        torch.jit.save(torch.jit.script(MarkovRows(table.float(), 64)), path)
    target, draft, sibling = (speculant.load(path) for path in paths)
    grid = dict(GRID, gammas=[2], trees=[[2, 2], [3]], temperatures=[0.8], top_k=0)
    serial = speculant.sweep(target, draft, PROMPTS, **grid, sibling_draft=sibling)
    frame = speculant.sweep(target, draft, PROMPTS, **grid, sibling_draft=sibling, executor=pool)
    assert frame.sibling_draft.tolist() == [False, True, True] and frame.attrs["failed"] == []
    assert frame[EXACT].equals(serial[EXACT])


def test_a_failing_setting_is_reported_and_the_others_returned(pair, pool):
    draft = drafters.PythonDrafter(short_continuations, VOCAB)
    grid = dict(GRID, gammas=[2, 6, 4], temperatures=[0.0], top_k=0)
    with pytest.warns(RuntimeWarning, match=r"1 of 3 settings failed .* gamma=6, verification='token', "
                                            r"temperature=0\.0, top_k=0, top_p=1\.0, lenience=1\.0 "
                                            r"\(IndexError: list index out of range\)"):
        frame = speculant.sweep(pair[0], draft, PROMPTS, **grid, executor=pool)
    assert frame.gamma.tolist() == [2, 4] and (frame.new_tokens == 12 * len(PROMPTS)).all()
    assert frame.attrs["failed"] == [{"gamma": 6, "tree": None, "siblings": None, "verification": "token",
                                      "sibling_draft": False, "temperature": 0.0, "top_k": 0, "top_p": 1.0,
                                      "lenience": 1.0,
                                      "error": "IndexError: list index out of range"}]
    # Serial, the same setting is a bug in the call: its exception propagates.
    with pytest.raises(IndexError):
        speculant.sweep(pair[0], draft, PROMPTS, **grid)


class KillingExecutor:
    """Runs every task on `inner`, except the last one submitted, which kills its worker once the others have
    finished (so that the failure is that setting's alone). Executors are duck-typed: submit is all it needs."""

    def __init__(self, inner, tasks: int):
        self.inner, self.tasks, self.futures = inner, tasks, []

    def submit(self, fn, *args, **kwargs):
        if len(self.futures) == self.tasks - 1:
            concurrent.futures.wait(self.futures)
            future = self.inner.submit(die)
        else:
            future = self.inner.submit(fn, *args, **kwargs)
        self.futures.append(future)
        return future


def test_a_dead_worker_is_a_failed_setting_not_a_hang(pair):
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=2, mp_context=context) as inner:
        with pytest.warns(RuntimeWarning, match=r"1 of 3 settings failed .* gamma=3, .*BrokenProcessPool"):
            frame = speculant.sweep(*pair, PROMPTS, **dict(GRID, gammas=[1, 2, 3], temperatures=[0.8], top_k=0),
                                    executor=KillingExecutor(inner, tasks=3))
    assert frame.gamma.tolist() == [1, 2]
    [failed] = frame.attrs["failed"]
    assert failed["gamma"] == 3 and failed["error"].startswith("BrokenProcessPool: ")


class Done:
    """A finished future that is not a concurrent.futures.Future (as another framework's might be)."""

    def __init__(self, fn, args):
        self.fn, self.args, self.cancelled = fn, args, False

    def result(self):
        return self.fn(*self.args)

    def cancel(self):
        self.cancelled = True
        return True


class Inline:
    """Runs a task when its result is asked for, in this process; the third one is interrupted (Ctrl-C)."""

    def __init__(self):
        self.futures = []

    def submit(self, fn, *args):
        self.futures.append(Done(fn if len(self.futures) != 2 else interrupt, args))
        return self.futures[-1]


def interrupt(*args):
    raise KeyboardInterrupt


def test_interrupting_an_executor_sweep_returns_finished_rows(pair):
    executor = Inline()
    with pytest.warns(RuntimeWarning, match="2 of 4 settings"):
        frame = speculant.sweep(*pair, PROMPTS, **dict(GRID, gammas=[1, 2, 3, 4], temperatures=[0.8], top_k=0),
                                executor=executor)
    assert frame.attrs["interrupted"] and frame.gamma.tolist() == [1, 2] and frame.attrs["failed"] == []
    assert [f.cancelled for f in executor.futures] == [True] * 4  # cancel() on all: a no-op on finished ones


def test_an_executor_that_refuses_tasks_fails_every_setting(pair):
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    executor.shutdown()
    with pytest.warns(RuntimeWarning, match="2 of 2 settings failed .*RuntimeError: cannot schedule new futures"):
        frame = speculant.sweep(*pair, PROMPTS, **dict(GRID, gammas=[1, 2], temperatures=[0.8], top_k=0),
                                executor=executor)
    assert len(frame) == 0 and list(frame.columns) == sweep_module.COLUMNS
    assert [f["gamma"] for f in frame.attrs["failed"]] == [1, 2]


class NoTasks:
    def submit(self, *args, **kwargs):
        raise AssertionError("nothing may be submitted")


def test_models_without_a_file_are_refused_before_anything_runs(pair, files):
    from support import hf_families

    target, draft = markov.target_and_draft(VOCAB, 3, draft_scale=1.0)
    in_memory = speculant.load(markov.cached_model(target)), speculant.load(markov.cached_model(draft))
    kwargs = dict(GRID, executor=NoTasks())
    with pytest.raises(ValueError, match=r"^target: the model <\w+ in memory> has no file behind it.*export"):
        speculant.sweep(in_memory[0], pair[1], PROMPTS, **kwargs)
    with pytest.raises(ValueError, match=r"^draft: the model <\w+ in memory> has no file behind it"):
        speculant.sweep(pair[0], in_memory[1], PROMPTS, **kwargs)
    model = hf_families.make("gpt2", seed=1)
    live = speculant.load(model), speculant.load(model)
    with pytest.raises(ValueError, match=r"^target: a transformers model object \(GPT2LMHeadModel\) has no file .*"
                                         r"save_pretrained"):
        speculant.sweep(*live, [[1, 2]], **kwargs)
    with pytest.raises(ValueError, match=r"^draft: the PythonDrafter's propose function cannot be sent .*"
                                         r"module level"):
        speculant.sweep(pair[0], drafters.PythonDrafter(lambda context, gamma: ([], None), VOCAB), PROMPTS,
                        **kwargs)
    with pytest.raises(ValueError, match="executor must be None or a concurrent.futures-style executor"):
        speculant.sweep(*pair, PROMPTS, **dict(GRID, executor=object()))


def test_a_save_pretrained_directory_travels_with_its_dtype(tmp_path):
    from support import hf_families

    hf_families.make("gpt2", seed=1).save_pretrained(tmp_path / "gpt2")
    model = speculant.load(tmp_path / "gpt2", dtype="bfloat16", vocab_size=1000)
    spec = workers.model_file(model, "target")
    assert spec == workers.ModelFile(str(tmp_path / "gpt2"), "cpu", "bfloat16", 1000)
    again = workers.rebuild(spec, "target")
    assert again.vocab_size == 1000 and next(again.module.parameters()).dtype == torch.bfloat16


def test_a_file_converted_at_load_travels_with_its_dtype(files):
    model = speculant.load(files[0], dtype="bfloat16")
    spec = workers.model_file(model, "target")
    assert spec == workers.ModelFile(str(files[0]), "cpu", "bfloat16")
    again = workers.rebuild(spec, "dtype test")
    assert again.load_dtype == "bfloat16"
    prompt = dict(max_new_tokens=8, temperature=0, seed=0)
    assert speculant.generate(again, [1, 2], **prompt).tokens == speculant.generate(model, [1, 2], **prompt).tokens


def test_a_worker_loads_each_model_once_and_a_new_file_again(files, tmp_path):
    spec = workers.model_file(speculant.load(files[0]), "target")
    first = workers.rebuild(spec, "target")
    assert workers.rebuild(spec, "target") is first
    assert workers.rebuild(spec, "draft") is not first  # one handle per role: each owns its cache
    os.utime(files[0], ns=(time.time_ns(), time.time_ns() + 10**9))  # the file exported anew
    assert workers.rebuild(spec, "target") is not first
    gone = workers.ModelFile(str(tmp_path / "missing.pt"), "cpu")
    with pytest.raises(FileNotFoundError, match="target: .*missing.pt .*readable on every worker"):
        workers.rebuild(gone, "target")


@pytest.fixture(scope="module")
def dask_executor():
    """A real dask LocalCluster: two worker processes, one thread each, its HTTP server on a free port (8787 may be
    taken, by the other torch's suite among others: run.sh runs them side by side). The client and the cluster are
    closed at the end of the module."""
    distributed = pytest.importorskip("distributed")
    import dask

    # allowed-failures 0: a task whose worker dies is reported at once (KilledWorker), not tried on 3 more
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           dashboard_address=":0")
    client = distributed.Client(cluster)
    yield client.get_executor()
    client.close()
    cluster.close()


def test_dask_cluster_gives_the_serial_numbers(pair, dask_executor):
    grid = dict(GRID, gammas=[1, 3], temperatures=[0.8], top_k=[0, 3])
    serial = speculant.sweep(*pair, PROMPTS, **grid)
    frame = speculant.sweep(*pair, PROMPTS, **grid, executor=dask_executor)
    again = speculant.sweep(*pair, PROMPTS, **grid, executor=dask_executor)
    assert frame[EXACT].equals(serial[EXACT]) and frame.attrs["failed"] == []
    assert not frame.seconds.equals(again.seconds)  # each sweep runs anew: no result cached by its arguments


def test_dask_reports_a_killed_worker(pair, dask_executor):
    with pytest.warns(RuntimeWarning, match=r"1 of 3 settings failed .* gamma=3, .*KilledWorker"):
        frame = speculant.sweep(*pair, PROMPTS, **dict(GRID, gammas=[1, 2, 3], temperatures=[0.8], top_k=0),
                                executor=KillingExecutor(dask_executor, tasks=3))
    assert frame.gamma.tolist() == [1, 2] and frame.attrs["failed"][0]["error"].startswith("KilledWorker: ")


class RayExecutor:
    """The thin adaptor of docs/research.md's "Sweeps on a cluster": Ray has no concurrent.futures executor, but an
    ObjectRef gives a concurrent.futures.Future."""

    def __init__(self, ray):
        self.ray = ray

    def submit(self, fn, *args):
        return self.ray.remote(fn).remote(*args).future()


def test_ray_gives_the_serial_numbers(pair):
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        grid = dict(GRID, gammas=[1, 3], temperatures=[0.8], top_k=0)
        serial = speculant.sweep(*pair, PROMPTS, **grid)
        frame = speculant.sweep(*pair, PROMPTS, **grid, executor=RayExecutor(ray))
    finally:
        ray.shutdown()
    assert frame[EXACT].equals(serial[EXACT]) and frame.attrs["failed"] == []
