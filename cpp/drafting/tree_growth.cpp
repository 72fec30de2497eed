#include "drafting/tree_growth.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "errors.h"
#include "device/upload.h"

namespace speculant {

TreeDraft::TreeDraft(const Tree& shape) : shape_(&shape), parent_{-1}, depth_{0}, token_{-1}, value_{0.0} {
  next_level();
}

TreeDraft::TreeDraft(const TreeGrowth& growth, int64_t budget, int64_t depth)
    : growth_(growth), budget_(budget), levels_(depth), parent_{-1}, depth_{0}, token_{-1}, value_{0.0} {
  require(growth.budget >= 1 && growth.depth >= 1 && growth.children >= 1 && growth.width >= 1,
          "a grown tree needs budget, depth, children and width >= 1");
  next_level();
}

void TreeDraft::grow(const std::vector<int64_t>& tokens, const std::vector<double>& log_q) {
  const int64_t total = std::accumulate(counts_.begin(), counts_.end(), int64_t{0});
  require(static_cast<int64_t>(tokens.size()) == total && (!values() || static_cast<int64_t>(log_q.size()) == total),
          "a tree level drew {} children with {} values, expected {}", tokens.size(), log_q.size(), total);
  size_t next = 0;
  for (size_t i = 0; i < expand_.size(); ++i) {
    const int64_t node = expand_[i];
    for (int64_t j = 0; j < counts_[i]; ++j, ++next) {
      parent_.push_back(node);
      depth_.push_back(depth_[node] + 1);
      token_.push_back(tokens[next]);
      value_.push_back(values() ? value_[node] + log_q[next] : 0.0);
    }
  }
  next_level();
}

int64_t TreeDraft::last_branching_depth() const {
  if (!shape_) return levels_;
  int64_t deepest = -1;
  for (int64_t v = 0; v < shape_->size(); ++v) {
    if (shape_->children(v) >= 2) deepest = std::max(deepest, shape_->depth(v));
  }
  return deepest;
}

// The newest depth's nodes are those after the last expanded node's children began: all nodes of the deepest
// depth (breadth-first order keeps them last).
void TreeDraft::next_level() {
  const int64_t deepest = depth_.back();
  int64_t begin = size();
  while (begin > 0 && depth_[begin - 1] == deepest) --begin;
  expand_.clear();
  counts_.clear();
  if (shape_) {
    for (int64_t v = begin; v < size(); ++v) {
      if (shape_->children(v) == 0) continue;
      expand_.push_back(v);
      counts_.push_back(shape_->children(v));
    }
    return;
  }
  if (budget_ == 0 || deepest >= levels_) return;
  std::vector<int64_t> candidates;
  for (int64_t v = begin; v < size(); ++v) {
    if (std::isfinite(value_[v])) candidates.push_back(v);  // a child q could not draw is never accepted
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [this](int64_t a, int64_t b) { return value_[a] > value_[b]; });
  candidates.resize(std::min<size_t>(candidates.size(), static_cast<size_t>(growth_->width)));
  std::vector<std::pair<int64_t, int64_t>> chosen;  // (node, children), placed in value order
  for (const int64_t v : candidates) {
    if (budget_ == 0) break;
    const int64_t k = std::min(growth_->children, budget_);
    budget_ -= k;
    chosen.emplace_back(v, k);
  }
  std::sort(chosen.begin(), chosen.end());  // breadth-first: children follow their parents' order
  for (const auto& [v, k] : chosen) {
    expand_.push_back(v);
    counts_.push_back(k);
  }
}

at::Tensor child_log_values(const at::Tensor& q, const at::Tensor& raw, const at::Tensor& children,
                            const std::vector<int64_t>& counts, bool greedy) {
  const at::Tensor law = greedy ? raw.to(at::kDouble).log_softmax(-1) : q.to(at::kDouble).log();  // [n, V]
  std::vector<int64_t> owner;  // each child's row
  for (size_t i = 0; i < counts.size(); ++i) owner.insert(owner.end(), counts[i], static_cast<int64_t>(i));
  const at::Tensor cells = upload(owner, law.device()) * law.size(1) + children;
  return law.flatten().index_select(0, cells);
}

TreeDraft TreePlan::draft(int64_t depth, int64_t nodes) const {
  if (growth) {
    return TreeDraft(*growth, std::max<int64_t>(0, std::min(growth->budget, nodes - 1)),
                     std::max<int64_t>(0, std::min(growth->depth, depth)));
  }
  int64_t d = std::max<int64_t>(0, std::min<int64_t>(depth, static_cast<int64_t>(by_depth.size()) - 1));
  while (d > 0 && by_depth[d].size() > nodes) --d;
  return TreeDraft(by_depth[d]);
}

}  // namespace speculant
