"""speculant: exact speculative decoding (Leviathan, Kalman & Matias, ICML 2023) with a C++ core.

Notation follows the paper: p is the target model M_p, q the draft (approximation) model M_q, gamma the draft
length, alpha the acceptance rate, l the lenience and c the cost coefficient.
"""

import torch  # noqa: F401  (loads libtorch before the extension that links against it)

from . import analysis, drafters, sampling
from . import testing
from ._core import Iteration, Stats
from .decoder import Result, SpeculativeDecoder, generate
from .export import export  # the function; the subpackage stays importable as speculant.export.<arch>
from .model import Model, load
from .sweep import sweep
from .trace import Trace

__all__ = [
    "Iteration",
    "Model",
    "Result",
    "SpeculativeDecoder",
    "Stats",
    "Trace",
    "analysis",
    "drafters",
    "export",
    "generate",
    "load",
    "sampling",
    "sweep",
    "testing",
]
__version__ = "0.1.0"
