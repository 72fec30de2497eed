"""Decoders in threads: the engine releases the GIL, so independent decoders run in parallel and give exactly
their serial results; one decoder entered from two threads at once refuses the second call (it never shares a
cache); Python drafters and live transformers models called back from threads neither deadlock nor crash."""

import threading

import pytest
import torch

from support import hf_families
import speculant
from support.engine_checks import same_seed_outputs
from speculant import drafters, tiny_gpt

pytestmark = pytest.mark.filterwarnings("ignore:model .* is in the plain form:UserWarning")


def tiny(seed: int) -> speculant.Model:
    torch.manual_seed(seed)
    return speculant.load(tiny_gpt.script_cached(tiny_gpt.TinyGPT(tiny_gpt.TinyGPTConfig(32, 2, 2, 16, 256))))


def uniform_drafter(vocab: int) -> drafters.PythonDrafter:
    return drafters.PythonDrafter(lambda context, gamma: ([context[-1] % vocab] * gamma,
                                                          torch.full((gamma, vocab), 1 / vocab)), vocab)


def run_in_threads(jobs):
    results, errors = [None] * len(jobs), []

    def work(i):
        try:
            results[i] = jobs[i]()
        except BaseException as error:  # noqa: B036 (reported to the test)
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    assert not errors, errors
    return results


def test_four_decoders_in_four_threads_equal_serial():
    model = hf_families.make("qwen2", seed=10)
    decoders = [
        speculant.SpeculativeDecoder(tiny(0), tiny(1), gamma=3),
        speculant.SpeculativeDecoder(tiny(2), uniform_drafter(32), gamma=2),           # Python drafter
        speculant.SpeculativeDecoder(model, hf_families.drafted(model, 0.02, 1), gamma=4),  # live models
        speculant.SpeculativeDecoder(tiny(3), drafters.PromptLookup(32), gamma=2),
    ]
    jobs = [lambda d=d, i=i: [d.generate([1, 2, 3], max_new_tokens=40, seed=100 * i + r).tokens for r in range(5)]
            for i, d in enumerate(decoders)]
    serial = [job() for job in jobs]
    assert run_in_threads(jobs) == serial


def test_one_decoder_from_two_threads_refuses_the_second_call():
    entered, release = threading.Event(), threading.Event()

    def propose(context, gamma):
        entered.set()
        release.wait(timeout=60)  # hold the first generation inside the drafter (the GIL is free here)
        return [1], torch.full((1, 32), 1 / 32)

    decoder = speculant.SpeculativeDecoder(tiny(0), drafters.PythonDrafter(propose, 32), gamma=1)
    first = threading.Thread(target=lambda: decoder.generate([1, 2], max_new_tokens=3, seed=0))
    first.start()
    try:
        assert entered.wait(timeout=60)
        with pytest.raises(RuntimeError, match="already generating in another thread"):
            decoder.generate([1, 2], max_new_tokens=3, seed=0)
    finally:
        release.set()
        first.join(timeout=60)
    assert len(decoder.generate([1, 2], max_new_tokens=3, seed=0).tokens) == 3  # usable again


class GradFree(torch.nn.Module):
    """The plain contract (forward -> logits) with parameters that require grad, refusing to run with autograd
    on: the engine must call every model in inference mode, or a user's model would record a graph per call."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(32, 32))  # requires_grad=True

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            raise RuntimeError("called with autograd enabled")
        return self.table[input_ids]  # [1, T, 32]


def test_every_model_call_runs_without_autograd():
    torch.manual_seed(0)
    scripted = torch.jit.script(GradFree())
    assert scripted.table.requires_grad
    decoder = speculant.SpeculativeDecoder(speculant.load(scripted), speculant.load(scripted), gamma=2)
    assert len(decoder.generate([1, 2], max_new_tokens=10, seed=0).tokens) == 10
    model = hf_families.make("gpt2", seed=1).requires_grad_(True)
    seen = []
    model.register_forward_hook(lambda module, args, out: seen.append((torch.is_grad_enabled(),
                                                                       out.logits.requires_grad)))
    speculant.generate(model, [1, 2], max_new_tokens=5, seed=0)
    assert seen and not any(grad or requires for grad, requires in seen)


def test_same_seed_same_tokens_across_processes_and_thread_counts():
    outputs = same_seed_outputs((1, 2, 1))
    assert len(outputs) == 1 and len(outputs.pop()) > 60
