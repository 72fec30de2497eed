// A verification's device work in CUDA graphs of its own (tree_verification.cpp: chains' and trees').
//
// On an accelerator a verification launches a few dozen small operations between its inputs (the target's logits,
// the draft's laws and tokens, the uniforms) and its one read-back: residuals, candidates, the read-back's joins.
// Their shapes are fixed by a small key (the rows' drafts, the sampling settings, the vocabulary, the dtypes) and
// the host needs none of their values before the read-back, so they can run as one CUDA graph per key (graphs.h's
// GraphCache: warm-up runs, then a capture, then replays). The uniforms are drawn outside, from each row's
// generator as without graphs: the same verdicts. A replay runs none of the code that placed the read-back's parts,
// so where each lies (the verification's Plan) is recorded from the key's first run and checked equal at every
// later run that is not a replay. `capture` false runs the same work through the same buffers without capturing,
// on any device (cuda_graphs="fixed": what a replay computes, checkable on a CPU).
//
// Keys past kMaxKeys run without the buffers (the same operations, so the same verdicts): a decoder whose rows'
// drafts vary (an adaptive gamma in a batch) would otherwise keep a set of buffers for every combination.
#pragma once

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "errors.h"
#include "device/graphs.h"

namespace speculant {

class VerificationGraphs {
 public:
  static constexpr int64_t kMaxKeys = 64;

  explicit VerificationGraphs(bool capture) : cache_(capture, nullptr) {}
  // Why the capture failed ("" if it has not): every verification then runs uncaptured.
  std::string failure() const { return cache_.failure(); }
  int64_t captured() const { return cache_.captured(); }
  // The verifications seen, by key.
  int64_t keys() const { return static_cast<int64_t>(plans_.size()); }

  // work(buffers, plan): the device work from its inputs (`in`'s shapes and dtypes, in fixed buffers) to one packed
  // read-back, recording where each part lies in `plan` (a Plan has same_places(const Plan&)). `key` names the
  // verification and every shape it depends on; one Plan type per key. Returns the packed read-back and the key's
  // plan, or nothing for a key past kMaxKeys (the caller runs the work itself).
  template <typename Plan>
  std::optional<std::pair<at::Tensor, const Plan*>> run(const std::string& key, const std::vector<at::Tensor>& in,
                                                        const std::function<at::Tensor(const std::vector<at::Tensor>&,
                                                                                       Plan&)>& work) {
    if (!plans_.contains(key) && keys() >= kMaxKeys) return std::nullopt;
    at::Tensor packed = cache_.run(CallKey{0, true, 0, key}, in, [&](const std::vector<at::Tensor>& buffers) {
      RECORD_USER_SCOPE("speculant::graphed");  // benchmarks/overhead.py: what a replay launches at once
      auto run = std::make_shared<Plan>();
      at::Tensor out = work(buffers, *run);
      const auto [known, added] = plans_.emplace(key, run);
      require(added || static_cast<const Plan*>(known->second.get())->same_places(*run),
              "{} placed its read-back differently in two runs", key);
      return out;
    });
    return std::make_pair(packed, static_cast<const Plan*>(plans_.at(key).get()));
  }

 private:
  GraphCache cache_;
  std::map<std::string, std::shared_ptr<const void>> plans_;  // by key: its Plan, from its first run
};

}  // namespace speculant
