// A verification's one device -> host read: tensors of any types ("parts") joined into one float64 tensor and
// copied to the host at once (token ids are exact in float64 up to 2^53). Parts of one type are joined first, one
// operation for all of them (on a GPU one kernel, where a join of mixed types copies each part in a kernel of its
// own), then the types into float64 in one more.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace speculant {

class ReadBack {
 public:
  // Adds a part (any shape, read flattened); returns its id for at().
  size_t add(const at::Tensor& part);
  // Joins the parts on their device and copies them to the host (a synchronization).
  void read();
  // Part `id`'s values, after read().
  const double* at(size_t id) const { return host_.const_data_ptr<double>() + offsets_[id]; }

 private:
  std::vector<at::Tensor> parts_;
  std::vector<int64_t> offsets_;
  at::Tensor host_;
};

}  // namespace speculant
