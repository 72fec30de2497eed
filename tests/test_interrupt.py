"""Ctrl-C stops a generation at the next model call: a real SIGINT sent to a subprocess that runs a long
generation (plain decoding of a TorchScript model, whose calls run in C++ with the GIL released; speculative
decoding through a Python drafter, the signal landing in the target's call or inside the drafter's callback)
raises KeyboardInterrupt there, and the same decoder then gives, for a seed, the tokens a fresh decoder gives.
An exception raised inside a Python drafter keeps its type.

No time is measured: the model (or the drafter) holds still inside a chosen call until the signal has landed,
and the test counts the calls made after it, in a state file the child's models and the test share."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import speculant
from speculant import drafters, tiny_gpt

# The int64 slots of the shared state file. The signal's own handler releases a held call: the child makes the
# file its wakeup fd (signal.set_wakeup_fd) at RELEASED's offset, so Python's C-level handler, once it has set
# the flag that raises KeyboardInterrupt, writes the signal's number there.
TARGET_CALLS, RELEASED, DRAFTER_CALLS, TARGET_HOLD, DRAFTER_HOLD = range(5)
SLOTS = 5
# A hang detector only, no bound on anything measured: a child does seconds of work on an idle machine, so this
# fires only on a real hang (a held call never released, a run that never ends), whatever the machine's load.
HANG = 600


class HeldPlain(torch.nn.Module):
    """tiny_gpt's plain form that counts its calls in the state file and, at call number TARGET_HOLD, stays in
    the call (a busy loop in TorchScript: C++, the GIL released) until the signal's handler has written
    RELEASED."""

    vocab_size: int
    max_length: int
    state_path: str

    def __init__(self, model: tiny_gpt.TinyGPT, state_path: str):
        super().__init__()
        self.model = model
        self.vocab_size = model.vocab_size
        self.max_length = model.max_length
        self.state_path = state_path

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        state = torch.from_file(self.state_path, shared=True, size=5, dtype=torch.long)
        state[0] += 1  # TARGET_CALLS
        if int(state[0]) == int(state[3]):  # TARGET_HOLD
            while int(state[1]) == 0:  # RELEASED
                pass
        return self.model(input_ids)


CHILD = r"""
import json, os, signal, sys, time, torch
# Python leaves SIGINT ignored when it starts ignored, as under a non-interactive shell's background job ('&'),
# which may be how the suite itself was started: install the handler that raises KeyboardInterrupt
signal.signal(signal.SIGINT, signal.default_int_handler)
import speculant
from speculant import drafters
mode, model_path, state_path = sys.argv[1:]
TARGET_CALLS, RELEASED, DRAFTER_CALLS, TARGET_HOLD, DRAFTER_HOLD = range(5)
state = torch.from_file(state_path, shared=True, size=5, dtype=torch.long)
target = speculant.load(model_path)

def propose(context, gamma):
    state[DRAFTER_CALLS] += 1
    if int(state[DRAFTER_CALLS]) == int(state[DRAFTER_HOLD]):
        while int(state[RELEASED]) == 0:
            time.sleep(0.001)  # Python work: the signal lands here, inside the callback
    return [context[-1] % 64], torch.full((1, 64), 1 / 64)

if mode == "plain":
    run = lambda max_new, seed: speculant.generate(target, [1, 2, 3], max_new_tokens=max_new, seed=seed)
else:
    decoder = speculant.SpeculativeDecoder(target, drafters.PythonDrafter(propose, 64), gamma=1)
    run = lambda max_new, seed: decoder.generate([1, 2, 3], max_new_tokens=max_new, seed=seed)
run(4, 0)  # warm up
# hold ten calls into the long run
if mode == "in_callback":
    state[DRAFTER_HOLD] = int(state[DRAFTER_CALLS]) + 10
else:
    state[TARGET_HOLD] = int(state[TARGET_CALLS]) + 10
wakeup = os.open(state_path, os.O_WRONLY | os.O_NONBLOCK)
os.lseek(wakeup, RELEASED * 8, os.SEEK_SET)
signal.set_wakeup_fd(wakeup)
print("started", flush=True)
try:
    run(200, 1)
    print("finished", flush=True)
except KeyboardInterrupt as error:  # the calls made up to here, before the runs below add theirs
    print("interrupted", json.dumps({"notes": getattr(error, "__notes__", []), "calls": [
        int(state[TARGET_CALLS]), int(state[DRAFTER_CALLS])]}), flush=True)
signal.set_wakeup_fd(-1)
again = run(20, 5).tokens
if mode == "plain":
    fresh = speculant.generate(target, [1, 2, 3], max_new_tokens=20, seed=5).tokens
else:
    fresh = speculant.SpeculativeDecoder(target, drafters.PythonDrafter(propose, 64), gamma=1).generate(
        [1, 2, 3], max_new_tokens=20, seed=5).tokens
print("same", again == fresh, flush=True)
"""


@pytest.fixture(scope="module")
def held_model(tmp_path_factory):
    """(model file, state file): HeldPlain over a TinyGPT of 256 positions, saved for the children."""
    folder = tmp_path_factory.mktemp("interrupt")
    state_path = str(folder / "state")
    torch.manual_seed(0)
    module = torch.jit.script(HeldPlain(tiny_gpt.TinyGPT(tiny_gpt.TinyGPTConfig(64, 2, 2, 32, 256)).eval(),
                                        state_path))
    model_path = str(folder / "held.pt")
    module.save(model_path)
    return model_path, state_path


@pytest.mark.parametrize("mode", ["plain", "python_drafter", "in_callback"])
def test_sigint_stops_a_generation_and_the_decoder_stays_usable(held_model, mode):
    """The child holds inside call k (the target's TARGET_HOLD-th call, C++ with the GIL released; or, in
    in_callback, the drafter's DRAFTER_HOLD-th propose, Python) until the SIGINT the test sends has landed. The
    interrupt must then come before any further call: the target's count stays at k, and no propose follows.
    Where the signal lands in the target's call, the engine's own check before the next call raises it, not
    Python's at the next propose (which would add the drafter's note); inside the callback, the callback raises
    it, with that note. An engine that ignored the flag until the end would finish the run (200-odd target calls,
    "finished"), not stop at k; one that checked it only where Python runs would finish the plain run too, and
    raise the others at the next propose, with the drafter's note."""
    model_path, state_path = held_model
    with open(state_path, "wb") as state_file:
        state_file.write(bytes(8 * SLOTS))
    state = torch.from_file(state_path, shared=True, size=SLOTS, dtype=torch.long)
    with subprocess.Popen([sys.executable, "-c", CHILD, mode, model_path, state_path], stdout=subprocess.PIPE,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}) as child:
        watchdog = threading.Timer(HANG, child.kill)  # a hang ends the child: its output then ends short
        watchdog.start()
        try:
            assert child.stdout.readline().strip() == "started"
            held, hold = (DRAFTER_CALLS, DRAFTER_HOLD) if mode == "in_callback" else (TARGET_CALLS, TARGET_HOLD)
            k = int(state[hold])
            while int(state[held]) < k:  # the child reaches call k, and stays in it
                assert child.poll() is None, "the child ended before the held call"
                time.sleep(0.01)
            assert int(state[RELEASED]) == 0
            target_calls, drafter_calls = int(state[TARGET_CALLS]), int(state[DRAFTER_CALLS])
            child.send_signal(signal.SIGINT)
            line = child.stdout.readline().strip()
            assert line.startswith("interrupted "), f"{line!r} (empty: a hang, the child killed after {HANG} s)"
            report = json.loads(line.removeprefix("interrupted "))
            assert int(state[RELEASED]) == signal.SIGINT  # the held call was released by the signal's handler
            # no model call after the one the signal landed in
            assert report["calls"] == [target_calls, drafter_calls]
            notes = report["notes"]
            from_callback = any("raised by the Python drafter's propose" in note for note in notes)
            assert from_callback == (mode == "in_callback"), notes
            assert child.stdout.readline().strip() == "same True"
            assert child.wait(timeout=HANG) == 0
        finally:
            watchdog.cancel()
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
