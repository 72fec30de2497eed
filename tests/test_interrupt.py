"""Ctrl-C stops a generation within one model call: a real SIGINT sent to a subprocess that runs a long
generation (plain decoding of a model that recomputes its whole prefix at every call, so that the run would
take minutes; and speculative decoding through a Python drafter) raises KeyboardInterrupt there, and the same
decoder then gives, for a seed, the tokens a fresh decoder gives. An exception raised inside a Python drafter
keeps its type."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import speculant
from speculant import drafters, tiny_gpt

CHILD = r"""
import signal, sys, time, torch
# Python leaves SIGINT ignored when it starts ignored, as under a non-interactive shell's background job ('&'),
# which may be how the suite itself was started: install the handler that raises KeyboardInterrupt
signal.signal(signal.SIGINT, signal.default_int_handler)
import speculant
from speculant import drafters, tiny_gpt
torch.manual_seed(0)
config = tiny_gpt.TinyGPTConfig(64, 2, 2, 32, 4096)
target = speculant.load(tiny_gpt.script_plain(tiny_gpt.TinyGPT(config).eval()))
if sys.argv[1] == "plain":
    run = lambda max_new, seed: speculant.generate(target, [1, 2, 3], max_new_tokens=max_new, seed=seed)
else:
    def propose(context, gamma):
        time.sleep(0.002)  # Python work: the signal may arrive here, inside the callback
        return [context[-1] % 64], torch.full((1, 64), 1 / 64)
    decoder = speculant.SpeculativeDecoder(target, drafters.PythonDrafter(propose, 64), gamma=1)
    run = lambda max_new, seed: decoder.generate([1, 2, 3], max_new_tokens=max_new, seed=seed)
run(4, 0)  # warm up
print("started", flush=True)
try:
    run(4000, 1)
    print("finished", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
again = run(20, 5).tokens
if sys.argv[1] == "plain":
    fresh = speculant.generate(target, [1, 2, 3], max_new_tokens=20, seed=5).tokens
else:
    fresh = speculant.SpeculativeDecoder(target, drafters.PythonDrafter(propose, 64), gamma=1).generate(
        [1, 2, 3], max_new_tokens=20, seed=5).tokens
print("same", again == fresh, flush=True)
"""
# seconds from the signal to the KeyboardInterrupt: the child's model calls take milliseconds and its run minutes,
# so an interrupt within one call arrives far inside this bound, which leaves a loaded machine a wide margin (the
# goal, 0.5 s, holds on an idle one)
DEADLINE = 5.0


@pytest.mark.parametrize("mode", ["plain", "python_drafter"])
def test_sigint_stops_a_generation_and_the_decoder_stays_usable(mode):
    with subprocess.Popen([sys.executable, "-c", CHILD, mode], stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}) as child:
        try:
            assert child.stdout.readline().strip() == "started"
            time.sleep(1.0)  # well inside the long generation
            sent = time.perf_counter()
            child.send_signal(signal.SIGINT)
            line = child.stdout.readline().strip()
            elapsed = time.perf_counter() - sent
            assert line == "interrupted"
            assert elapsed < DEADLINE, f"KeyboardInterrupt {elapsed:.3f} s after SIGINT"
            assert child.stdout.readline().strip() == "same True"
            assert child.wait(timeout=60) == 0
        finally:
            child.kill()


class DrafterError(RuntimeError):
    pass


def test_python_drafter_exception_keeps_its_type():
    torch.manual_seed(0)
    target = speculant.load(tiny_gpt.script_cached(tiny_gpt.TinyGPT(tiny_gpt.TinyGPTConfig(16, 1, 1, 8, 32))))

    def propose(context, gamma):
        raise DrafterError("no idea")

    decoder = speculant.SpeculativeDecoder(target, drafters.PythonDrafter(propose, 16), gamma=2)
    with pytest.raises(DrafterError, match="no idea") as info:
        decoder.generate([1, 2], max_new_tokens=5, seed=0)
    assert any("raised by the Python drafter's propose(context, gamma=2)" in note
               for note in getattr(info.value, "__notes__", []))
