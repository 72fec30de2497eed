#include "device/read_back.h"

#include <algorithm>
#include <atomic>

#include "errors.h"
#include "device/join.h"

namespace speculant {
namespace {

std::atomic<int64_t> reads{0}, values{0};

}  // namespace

at::Tensor to_host(const at::Tensor& t) {
  reads.fetch_add(1, std::memory_order_relaxed);
  values.fetch_add(t.numel(), std::memory_order_relaxed);
  return t.cpu();
}

HostReads host_reads() { return {reads.load(std::memory_order_relaxed), values.load(std::memory_order_relaxed)}; }

size_t ReadBack::add(const at::Tensor& part) {
  require(host_.defined() == false, "ReadBack::add after read()");
  require(parts_.empty() || part.device() == parts_[0].device(), "ReadBack: every part on one device");
  parts_.push_back(part.reshape({-1}));
  return parts_.size() - 1;
}

at::Tensor ReadBack::pack() {
  require(!parts_.empty(), "ReadBack::pack with no parts");
  // the types in the order they first appear, each type's parts in the order added
  std::vector<at::ScalarType> types;
  for (const at::Tensor& part : parts_) {
    if (std::find(types.begin(), types.end(), part.scalar_type()) == types.end()) types.push_back(part.scalar_type());
  }
  std::vector<at::Tensor> groups;
  offsets_.assign(parts_.size(), 0);
  int64_t size = 0;
  for (const at::ScalarType type : types) {
    std::vector<at::Tensor> group;
    for (size_t i = 0; i < parts_.size(); ++i) {
      if (parts_[i].scalar_type() != type) continue;
      offsets_[i] = size;
      size += parts_[i].numel();
      group.push_back(parts_[i]);
    }
    groups.push_back(joined(group));
  }
  if (groups.size() == 1 && groups[0].scalar_type() == at::kDouble) return groups[0];
  at::Tensor out = at::empty({size}, parts_[0].options().dtype(at::kDouble));
  at::cat_out(out, groups);
  return out;
}

void ReadBack::load(const at::Tensor& packed) {
  require(packed.dim() == 1 && packed.scalar_type() == at::kDouble, "ReadBack::load: a pack()'s float64 [size]");
  host_ = to_host(packed);
}

}  // namespace speculant
