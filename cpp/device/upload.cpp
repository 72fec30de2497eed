#include "device/upload.h"

#include <algorithm>

namespace speculant {

at::Tensor host_buffer(at::IntArrayRef sizes, at::ScalarType dtype, const at::Device& device) {
  return at::empty(sizes, at::TensorOptions().dtype(dtype).pinned_memory(device.is_cuda()));
}

at::Tensor upload(const at::Tensor& buffer, const at::Device& device) {
  return device.is_cpu() ? buffer : buffer.to(device, /*non_blocking=*/true);
}

at::Tensor upload(const std::vector<int64_t>& values, const at::Device& device) {
  at::Tensor buffer = host_buffer({static_cast<int64_t>(values.size())}, at::kLong, device);
  std::copy(values.begin(), values.end(), buffer.mutable_data_ptr<int64_t>());
  return upload(buffer, device);
}

}  // namespace speculant
