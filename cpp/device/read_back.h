// A verification's one device -> host read: tensors of any types ("parts") joined into one float64 tensor and
// copied to the host at once (token ids are exact in float64 up to 2^53). Parts of one type are joined first, one
// operation for all of them (on a GPU one kernel, where a join of mixed types copies each part in a kernel of its
// own), then the types into float64 in one more.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace speculant {

// t copied to the host (a synchronization on an accelerator), counted: every device -> host read of the decoding
// loop and its drafters goes through here, so that tests on the tensor path count them (host_reads).
at::Tensor to_host(const at::Tensor& t);
struct HostReads {
  int64_t reads = 0, values = 0;  // since the process started: the reads, and the elements they copied
};
HostReads host_reads();

class ReadBack {
 public:
  ReadBack() = default;
  // The read-back of a later pack() of the same parts, whose places `offsets` are (a graph's replay: the code that
  // added the parts did not run), for load().
  explicit ReadBack(std::vector<int64_t> offsets) : offsets_(std::move(offsets)) {}

  // Adds a part (any shape, read flattened); returns its id for at().
  size_t add(const at::Tensor& part);
  // Joins the parts on their device into one float64 tensor, fixing each part's place (offsets()).
  at::Tensor pack();
  // Copies a pack()'s result to the host (a synchronization).
  void load(const at::Tensor& packed);
  // pack(), then load().
  void read() { load(pack()); }
  const std::vector<int64_t>& offsets() const { return offsets_; }
  // Part `id`'s values, after load().
  const double* at(size_t id) const { return host_.const_data_ptr<double>() + offsets_[id]; }

 private:
  std::vector<at::Tensor> parts_;
  std::vector<int64_t> offsets_;
  at::Tensor host_;
};

}  // namespace speculant
