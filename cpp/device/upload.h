// Host data onto the models' device without a synchronizing copy. A plain CPU tensor copied to CUDA makes the host
// wait for every queued kernel (the copy is synchronous), so that the host cannot queue the next operations while
// the GPU still runs a model call. These buffers are pinned on CUDA and copied non-blocking: the caching host
// allocator keeps a buffer until its copy has run. On the CPU the buffer is the tensor itself.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace speculant {

// An uninitialized host buffer to fill and then upload() to `device`.
at::Tensor host_buffer(at::IntArrayRef sizes, at::ScalarType dtype, const at::Device& device);
at::Tensor upload(const at::Tensor& buffer, const at::Device& device);
// int64 [values.size()] on `device`.
at::Tensor upload(const std::vector<int64_t>& values, const at::Device& device);

}  // namespace speculant
