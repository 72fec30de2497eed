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

import sys

from . import _core
from .decoding import beams, cross_tokenizer, decoder, drafters, graphs, sampling, trace, trees
from .models import compiled_live, layer_masks, live, model, relative_trees, sequence_logits, tiny_gpt
from .models import export as exporters
from .research import analysis, distillation, sweep as sweeps, testing, timing, workers
from . import demo
from .demo import pair as demo_pair
from ._core import Iteration, Stats
from .decoding.beams import BeamResult
from .decoding.decoder import DynamicTree, Result, SpeculativeDecoder, generate
from .decoding.sampling import SamplingSettings
from .decoding.trace import Trace
from .models.export import export  # the function; the exporters stay importable as speculant.export.<arch>
from .models.model import Model, load
from .models.early_exit import EarlyExitDraft
from .models.eagle import EagleDraft
from .models.medusa import MedusaDraft
from .research.distillation import distill
from .research.sweep import sweep

# The flat module names of speculant 0.1 (speculant.analysis, speculant.tiny_gpt, speculant.export.llama, ...), used
# by notebooks and users' code, name the same modules in their layers: decoding, models, research, demo (to run one
# as a script, name its layer: python -m speculant.demo.pair).
for _name, _module in {"beams": beams, "cross_tokenizer": cross_tokenizer, "decoder": decoder, "drafters": drafters,
                       "graphs": graphs, "sampling": sampling, "trace": trace, "trees": trees,
                       "compiled_live": compiled_live, "layer_masks": layer_masks, "live": live, "model": model,
                       "relative_trees": relative_trees, "sequence_logits": sequence_logits, "tiny_gpt": tiny_gpt,
                       "export": exporters, "analysis": analysis, "distillation": distillation,
                       "sweep": sweeps, "testing": testing, "timing": timing, "workers": workers,
                       "demo_pair": demo_pair}.items():
    sys.modules[f"{__name__}.{_name}"] = _module
del _name, _module, exporters, sweeps


def __getattr__(name: str):
    """speculant.plots, imported when first asked for: it needs matplotlib (the research extra)."""
    if name == "plots":
        from .research import plots

        return plots
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "BeamResult",
    "DynamicTree",
    "EagleDraft",
    "EarlyExitDraft",
    "Iteration",
    "MedusaDraft",
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
