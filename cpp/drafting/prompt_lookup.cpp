#include "drafting/prompt_lookup.h"

#include <algorithm>

#include "errors.h"

namespace speculant {
namespace {

class PromptLookupDrafter final : public SequenceDrafter {
 public:
  PromptLookupDrafter(int64_t vocab, int64_t min_ngram, int64_t max_ngram, const at::Device& device)
      : SequenceDrafter(DrafterFacts{"prompt_lookup", vocab, device, false, std::nullopt, std::nullopt, [] {
          return std::string("the prompt_lookup drafter proposes chains only; a tree of drafts needs a draft model");
        }}),
        vocab_(vocab), min_ngram_(min_ngram), max_ngram_(max_ngram), device_(device) {
    require(vocab >= 1, "vocab_size must be >= 1, got {}", vocab);
    require(min_ngram >= 1 && max_ngram >= min_ngram,
            "prompt lookup needs 1 <= min_ngram <= max_ngram, got min_ngram = {}, max_ngram = {}", min_ngram,
            max_ngram);
  }

  Proposal propose(const std::vector<int64_t>& context, int64_t gamma, const SamplingConfig&,
                   at::Generator&) override {
    Proposal out;
    std::vector<int64_t> continuation = lookup(context, gamma);
    if (continuation.empty()) return out;
    auto options = at::TensorOptions(device_).dtype(at::kLong);
    out.tokens = at::tensor(continuation, options);                            // [k]
    out.q = at::one_hot(out.tokens, vocab_).to(at::kFloat);                    // [k, V] point masses
    return out;
  }

 private:
  // The tokens after the latest earlier occurrence of the longest matching suffix n-gram, at most gamma.
  std::vector<int64_t> lookup(const std::vector<int64_t>& history, int64_t gamma) const {
    const int64_t length = static_cast<int64_t>(history.size());
    for (int64_t n = std::min(max_ngram_, length - 1); n >= min_ngram_; --n) {
      const int64_t* suffix = history.data() + length - n;
      for (int64_t start = length - n - 1; start >= 0; --start) {  // latest occurrence first
        if (std::equal(suffix, suffix + n, history.data() + start)) {
          const int64_t from = start + n, count = std::min(gamma, length - from);
          return {history.begin() + from, history.begin() + from + count};
        }
      }
    }
    return {};
  }

  int64_t vocab_, min_ngram_, max_ngram_;
  at::Device device_;
};

}  // namespace

std::shared_ptr<Drafter> prompt_lookup_drafter(int64_t vocab_size, int64_t min_ngram, int64_t max_ngram,
                                               const at::Device& device) {
  return std::make_shared<PromptLookupDrafter>(vocab_size, min_ngram, max_ngram, device);
}

}  // namespace speculant
