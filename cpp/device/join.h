// Joining per-row tensors. at::stack and at::cat copy even a single tensor (an operation, so a kernel launch on a
// GPU); with one row these return a view of it instead.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace speculant {

inline at::Tensor stacked(const std::vector<at::Tensor>& rows) {
  return rows.size() == 1 ? rows[0].unsqueeze(0) : at::stack(rows);
}

inline at::Tensor joined(const std::vector<at::Tensor>& rows) { return rows.size() == 1 ? rows[0] : at::cat(rows); }

}  // namespace speculant
