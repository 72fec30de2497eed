"""speculant: exact speculative decoding (Leviathan, Kalman & Matias, ICML 2023) with a C++ core.

Notation follows the paper: p is the target model M_p, q the draft (approximation) model M_q, gamma the draft
length, alpha the acceptance rate, l the lenience and c the cost coefficient.
"""

import torch  # loads libtorch before the extension that links against it


def check_torch(built: str, installed: str) -> None:
    """Raises ImportError unless the installed torch is the one the C++ extension was compiled against (its
    C++ ABI changes between releases: another torch would fail with an undefined symbol)."""
    if built != installed:
        raise ImportError(
            f"speculant's C++ extension was built against torch {built}, but torch {installed} is installed. "
            "Rebuild it against this torch, from the source tree: pip install --no-build-isolation "
            "--force-reinstall --no-deps <path to speculant> (or bash scripts/run.sh demo)")


try:
    from ._build import TORCH_VERSION as _BUILT_TORCH
except ImportError:  # a source tree that was never built
    raise ImportError("speculant's C++ extension is not built: pip install --no-build-isolation <path to "
                      "speculant> (or bash scripts/run.sh demo)") from None
check_torch(_BUILT_TORCH, torch.__version__)

from . import analysis, beams, drafters, graphs, sampling
from . import testing
from ._core import Iteration, Stats
from .beams import BeamResult
from .decoder import DynamicTree, Result, SpeculativeDecoder, generate
from .distillation import distill
from .export import export  # the function; the subpackage stays importable as speculant.export.<arch>
from .model import Model, load
from .sampling import SamplingSettings
from .sweep import sweep
from .trace import Trace

__all__ = [
    "BeamResult",
    "DynamicTree",
    "Iteration",
    "Model",
    "Result",
    "SamplingSettings",
    "SpeculativeDecoder",
    "Stats",
    "Trace",
    "analysis",
    "beams",
    "distill",
    "drafters",
    "export",
    "generate",
    "load",
    "sampling",
    "sweep",
    "testing",
]
__version__ = "0.1.0"
