#include "models/continuation.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <mutex>

#include "errors.h"
#include "loop/interrupt.h"

namespace speculant {

GreedyContinuation::GreedyContinuation(std::shared_ptr<Model> model) : model_(std::move(model)) {
  require(model_ != nullptr, "model must be a model");
  require(!model_->encoder_decoder(), "a greedy continuation needs a decoder-only model");
}

std::vector<int64_t> GreedyContinuation::operator()(const std::vector<int64_t>& ids, int64_t count) {
  require(!ids.empty(), "ids is empty: a continuation needs at least one token");
  require(count >= 0, "count must be >= 0, got {}", count);
  const int64_t vocab = model_->vocab_size(), n = static_cast<int64_t>(ids.size());
  for (int64_t token : ids) {
    require(token >= 0 && token < vocab, "ids holds token {}, outside the vocabulary [0, {})", token, vocab);
  }
  const auto limit = model_->max_length();
  if (limit) count = std::min(count, *limit - n);
  std::vector<int64_t> out;
  if (count <= 0) return out;
  const std::lock_guard<std::mutex> lock(model_->in_use());
  c10::InferenceMode inference_mode;
  const auto options = at::TensorOptions(model_->device()).dtype(at::kLong);
  auto tensor = [&](const std::vector<int64_t>& tokens) {
    return at::tensor(tokens, at::kLong).to(model_->device());
  };
  // Positions shared with the cache, the last token excluded (its logits are this call's first row). Another
  // user of the model may have changed its cache since: then its length differs and nothing is reused.
  int64_t shared = 0;
  if (model_->length() == static_cast<int64_t>(cached_.size())) {
    const int64_t most = std::min<int64_t>(cached_.size(), n - 1);
    while (shared < most && cached_[shared] == ids[shared]) ++shared;
  }
  if (shared == 0) {
    model_->reset(tensor(std::vector<int64_t>(ids.begin(), ids.end() - 1)));
  } else {
    model_->truncate(shared);
    if (shared < n - 1) model_->extend(tensor(std::vector<int64_t>(ids.begin() + shared, ids.end() - 1)));
  }
  reused_ += shared;
  cached_.assign(ids.begin(), ids.end() - 1);
  int64_t token = ids.back();
  for (int64_t i = 0; i < count; ++i) {
    check_interrupt();
    const at::Tensor logits = model_->extend(at::full({1}, token, options));  // [1, V]
    cached_.push_back(token);
    token = logits.argmax(-1).item<int64_t>();
    out.push_back(token);
  }
  return out;
}

}  // namespace speculant
