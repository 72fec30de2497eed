"""What the fused operations' CUDA tests share (test_fused_ops.py, test_fused_linear.py, test_rotate_and_cache.py):
a kernel's output against a float64 reference computed on the CPU, and the tolerance each dtype allows."""
import torch

# relative error (2-norm) of a kernel's output against its float64 reference, by the output's dtype
TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| with `want` float64 on the CPU; got must hold no NaN (poisoned outputs unwritten)."""
    assert not got.isnan().any()
    return ((got.double().cpu() - want).norm() / want.norm()).item()
