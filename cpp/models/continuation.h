// Greedy continuations of one model that keep its KV cache between calls: each call reuses the cached
// positions its sequence shares with the previous call's and runs only the rest (CrossTokenizer's draft: each
// iteration's text mostly extends the last one's, re-tokenized).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "models/model.h"

namespace speculant {

class GreedyContinuation {
 public:
  explicit GreedyContinuation(std::shared_ptr<Model> model);
  // The model's `count` argmax tokens after `ids` (>= 1 token; fewer when max_length is reached), the first
  // index on ties, as generate(temperature=0) gives them. Locks the model while it runs.
  std::vector<int64_t> operator()(const std::vector<int64_t>& ids, int64_t count);
  int64_t reused() const { return reused_; }  // positions taken from the cache instead of run, over all calls

 private:
  std::shared_ptr<Model> model_;
  std::vector<int64_t> cached_;  // the tokens in the model's cache after the last call (its first positions)
  int64_t reused_ = 0;
};

}  // namespace speculant
