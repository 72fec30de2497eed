#pragma once
// What the fused operations' CUDA paths share (ops.cpp, linear.cpp): a tensor's dtype as the kernels name it,
// and a launch's error as an exception.
#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include "kernels/launch.h"

namespace speculant::kernels {

inline Dtype kernel_dtype(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat: return Dtype::float32;
    case at::kBFloat16: return Dtype::bfloat16;
    case at::kHalf: return Dtype::float16;
    default: TORCH_CHECK_VALUE(false, op, ": dtype must be float32, bfloat16 or float16, got ", t.scalar_type());
  }
}

inline void check_launch(int error, const char* op) {
  TORCH_CHECK(error == 0, op, ": the CUDA launch failed: ", cudaGetErrorString(static_cast<cudaError_t>(error)));
}

}  // namespace speculant::kernels
