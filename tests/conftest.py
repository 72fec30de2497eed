"""Shared pytest configuration for speculant's tests.

Warnings are errors (pyproject.toml's filterwarnings = ["error", ...]). TorchScript's own deprecation
warnings ("`torch.jit.script` is deprecated. Please switch to ...": a DeprecationWarning in torch 2.11,
where we saw it, and a FutureWarning by 2.14, pytorch#173015) are the only ones let through, filtered by
message here so that no other deprecation is hidden.
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # the shared helpers: `from support.laws import ...` (tests/support/)

from support import hf_families  # noqa: E402
import speculant  # noqa: E402

# `torch.jit.script`, `torch.jit.trace`, `torch.jit.save`, `torch.jit.load`, `...script_method`, ...
TORCHSCRIPT_DEPRECATION = r"`torch\.jit\.\w+` is deprecated"


def pytest_configure(config: pytest.Config) -> None:
    # Appended after pyproject.toml's "error", so these take precedence over it.
    for category in ("DeprecationWarning", "FutureWarning"):
        config.addinivalue_line("filterwarnings", f"ignore:{TORCHSCRIPT_DEPRECATION}:{category}")
    config.addinivalue_line("markers", "cuda: needs a CUDA device (skipped without one)")
    # The models under test are tiny: intra-op threads only add contention (on a loaded 2-core
    # machine a [3, 4] softmax took 10 ms with 2 threads and 4 us with one).
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def pt2_zoo(tmp_path_factory):
    """family -> (transformers model, .pt2 path): tests/support/hf_families.py models (seed 10) exported by
    speculant.export(format="pt2") on first use (hf_families.PT2_* sizes) and kept for the session, since
    AOTInductor compiles C++ for about 20 s per model on this CPU."""
    built = {}

    def get(family: str):
        if family not in built:
            model = hf_families.make(family, seed=10)
            path = tmp_path_factory.mktemp("pt2") / f"{family}.pt2"
            encoder_decoder = hf_families.is_encoder_decoder(family)
            extra = {"max_source_length": hf_families.PT2_MAX_SOURCE_LENGTH} if encoder_decoder else {}
            speculant.export(model, path, max_length=hf_families.PT2_MAX_LENGTH, **extra)
            built[family] = model, path
        return built[family]

    return get


@pytest.fixture(scope="session")
def smoke_pair(tmp_path_factory):
    """(target_path, draft_path): the demo pair's models after two training steps (the same code path and
    sizes as demo_pair.default_pair(), in seconds rather than minutes), trained once per session."""
    from speculant import demo_pair

    return demo_pair.default_pair(progress=False, recipe=demo_pair.DEFAULT_RECIPE.smoke(),
                                  cache_dir=tmp_path_factory.mktemp("smoke_pair"))
