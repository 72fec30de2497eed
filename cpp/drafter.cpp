// The built-in drafters: a neural draft model, unigram / bigram tables, prompt lookup.
#include "drafter.h"

#include <torch/cuda.h>

#include <array>
#include <numeric>
#include <chrono>

#include "errors.h"
#include "interrupt.h"
#include "step.h"

namespace speculant {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A draft Model. Invariant between iterations: the model has cached the sequence except `pending_`, which
// it is fed first in the next proposal (the last token; also the last proposed token when all were kept,
// since the model sampled that token but never ran on it).
class ModelDrafter final : public Drafter {
 public:
  explicit ModelDrafter(std::shared_ptr<Model> model) : model_(std::move(model)) {}

  void encode(const at::Tensor& source) override { model_->encode(source); }
  void begin(const at::Tensor& prompt, const std::vector<int64_t>&) override {
    const int64_t length = prompt.numel();
    model_->reset(prompt.narrow(0, 0, length - 1));
    pending_ = prompt.narrow(0, length - 1, 1);
  }

  Proposal propose(int64_t gamma, const SamplingConfig& config, at::Generator& generator,
                   bool profile) override {
    Proposal out;
    proposed_ = gamma;
    if (gamma == 0) return out;
    const bool sync = profile && model_->device().is_cuda();
    std::vector<at::Tensor> x_rows, q_rows, maxima;
    at::Tensor feed = pending_;
    for (int64_t i = 0; i < gamma; ++i) {
      if (i > 0) check_interrupt();  // the decoder checked before the first
      const auto start = Clock::now();
      at::Tensor logits = model_->extend(feed);  // [k, V]
      if (sync) torch::cuda::synchronize();
      out.seconds += seconds_since(start);
      DraftDraw draw = draft_step(logits.narrow(0, logits.size(0) - 1, 1), config, generator);  // after the last fed token
      q_rows.push_back(draw.q);
      x_rows.push_back(draw.token);
      if (draw.maximum.defined()) maxima.push_back(draw.maximum);
      out.finite = out.finite && draw.finite;
      feed = draw.token;
    }
    out.calls = gamma;
    out.tokens = at::cat(x_rows, 0);
    out.q = at::cat(q_rows, 0);
    if (!maxima.empty()) out.maxima = at::cat(maxima, 0);
    last_ = out.tokens;
    return out;
  }

  void advance(int64_t accepted, const at::Tensor& t, const std::vector<int64_t>&, int64_t) override {
    if (proposed_ == 0) {  // the model ran on nothing: it is fed the old pending tokens and t next time
      pending_ = at::cat({pending_, t});
    } else if (accepted < proposed_) {
      // it ran on pending + x_1 .. x_{k-1}: keep what precedes the rejected token, t becomes pending
      model_->truncate(model_->length() - (proposed_ - 1 - accepted));
      pending_ = t;
    } else {  // all kept: it never ran on x_k
      pending_ = at::cat({last_.narrow(0, proposed_ - 1, 1), t});
    }
  }

  int64_t vocab_size() const override { return model_->vocab_size(); }
  at::Device device() const override { return model_->device(); }
  bool encoder_decoder() const override { return model_->encoder_decoder(); }
  std::optional<int64_t> max_length() const override { return model_->max_length(); }
  std::optional<int64_t> max_source_length() const override { return model_->max_source_length(); }
  std::string name() const override { return "model"; }
  Model* model() override { return model_.get(); }

 private:
  std::shared_ptr<Model> model_;
  at::Tensor pending_;  // [m] int64 on the device
  at::Tensor last_;     // [k] the last proposal
  int64_t proposed_ = 0;
};

// Unigram / bigram tables. The rows are built on the host, standardized and sampled on the device.
class TableDrafter final : public Drafter {
 public:
  TableDrafter(const at::Tensor& unigram, std::optional<std::array<at::Tensor, 3>> bigram, const at::Device& device)
      : device_(device) {
    require(unigram.dim() == 1 && unigram.numel() > 0, "unigram must be a 1-D tensor of probabilities [V]");
    unigram_ = unigram.to(at::kDouble).contiguous();
    require(at::isfinite(unigram_).all().item<bool>() && (unigram_ > 0).all().item<bool>(),
            "unigram probabilities must be finite and positive (smooth the counts)");
    unigram_ = unigram_ / unigram_.sum();
    log_unigram_ = unigram_.log().to(at::kFloat).to(device_).view({1, -1});  // [1, V]
    if (bigram) {
      const int64_t vocab = unigram_.numel();
      row_ptr_ = (*bigram)[0].to(at::kLong).contiguous();
      followers_ = (*bigram)[1].to(at::kLong).contiguous();
      counts_ = (*bigram)[2].to(at::kDouble).contiguous();
      require(row_ptr_.dim() == 1 && row_ptr_.numel() == vocab + 1, "row_ptr must have V + 1 = {} entries, got {}",
              vocab + 1, row_ptr_.numel());
      require(followers_.numel() == counts_.numel() && row_ptr_[vocab].item<int64_t>() == followers_.numel() &&
                  row_ptr_[0].item<int64_t>() == 0,
              "followers and counts must hold row_ptr[V] = {} entries", row_ptr_[vocab].item<int64_t>());
      require(followers_.numel() == 0 || (followers_.min().item<int64_t>() >= 0 &&
                                           followers_.max().item<int64_t>() < vocab),
              "followers must be token ids in [0, {})", vocab);
      require(counts_.numel() == 0 || (counts_ > 0).all().item<bool>(), "bigram counts must be positive");
      require((row_ptr_.narrow(0, 1, vocab) >= row_ptr_.narrow(0, 0, vocab)).all().item<bool>(),
              "row_ptr must be nondecreasing");
    }
  }

  void begin(const at::Tensor&, const std::vector<int64_t>& host_prompt) override { last_ = host_prompt.back(); }

  Proposal propose(int64_t gamma, const SamplingConfig& config, at::Generator& generator, bool) override {
    Proposal out;
    if (gamma == 0) return out;
    std::vector<at::Tensor> x_rows, q_rows;
    int64_t previous = last_;
    for (int64_t i = 0; i < gamma; ++i) {
      DraftDraw draw = draft_step(logits_after(previous), config, generator);  // finite: log probabilities
      q_rows.push_back(draw.q);
      x_rows.push_back(draw.token);
      if (bigram()) previous = draw.token.item<int64_t>();  // the next row depends on it (a scalar read per token)
    }
    out.tokens = at::cat(x_rows, 0);
    out.q = at::cat(q_rows, 0);
    return out;
  }

  void advance(int64_t, const at::Tensor&, const std::vector<int64_t>&, int64_t t_host) override { last_ = t_host; }

  int64_t vocab_size() const override { return unigram_.numel(); }
  at::Device device() const override { return device_; }
  std::string name() const override { return bigram() ? "bigram" : "unigram"; }

 private:
  bool bigram() const { return row_ptr_.defined(); }

  // log q(. | previous) [1, V] on the device
  at::Tensor logits_after(int64_t previous) const {
    if (!bigram()) return log_unigram_;
    // host tensors: read through pointers, not with per-element tensor ops
    const int64_t* row_ptr = row_ptr_.data_ptr<int64_t>();
    const int64_t begin = row_ptr[previous], end = row_ptr[previous + 1];
    if (begin == end) return log_unigram_;  // never seen followed by anything: the unigram
    at::Tensor counts = counts_.narrow(0, begin, end - begin);
    const double* c = counts_.data_ptr<double>();
    const double distinct = static_cast<double>(end - begin), total = std::accumulate(c + begin, c + end, 0.0);
    at::Tensor row = unigram_ * distinct;  // [V] Witten-Bell: T(a) u(b) + c(a, b), over c(a) + T(a)
    row.index_add_(0, followers_.narrow(0, begin, end - begin), counts);
    return (row / (total + distinct)).log().to(at::kFloat).to(device_).view({1, -1});
  }

  at::Device device_;
  at::Tensor unigram_, log_unigram_, row_ptr_, followers_, counts_;
  int64_t last_ = 0;
};

class PromptLookupDrafter final : public HostHistoryDrafter {
 public:
  PromptLookupDrafter(int64_t vocab, int64_t min_ngram, int64_t max_ngram, const at::Device& device)
      : vocab_(vocab), min_ngram_(min_ngram), max_ngram_(max_ngram), device_(device) {
    require(vocab >= 1, "vocab_size must be >= 1, got {}", vocab);
    require(min_ngram >= 1 && max_ngram >= min_ngram,
            "prompt lookup needs 1 <= min_ngram <= max_ngram, got min_ngram = {}, max_ngram = {}", min_ngram,
            max_ngram);
  }

  Proposal propose(int64_t gamma, const SamplingConfig&, at::Generator&, bool) override {
    Proposal out;
    std::vector<int64_t> continuation = lookup(gamma);
    if (continuation.empty()) return out;
    auto options = at::TensorOptions(device_).dtype(at::kLong);
    out.tokens = at::tensor(continuation, options);                            // [k]
    out.q = at::one_hot(out.tokens, vocab_).to(at::kFloat);                    // [k, V] point masses
    return out;
  }

  int64_t vocab_size() const override { return vocab_; }
  at::Device device() const override { return device_; }
  std::string name() const override { return "prompt_lookup"; }

 private:
  // The tokens after the latest earlier occurrence of the longest matching suffix n-gram, at most gamma.
  std::vector<int64_t> lookup(int64_t gamma) const {
    const int64_t length = static_cast<int64_t>(history().size());
    for (int64_t n = std::min(max_ngram_, length - 1); n >= min_ngram_; --n) {
      const int64_t* suffix = history().data() + length - n;
      for (int64_t start = length - n - 1; start >= 0; --start) {  // latest occurrence first
        if (std::equal(suffix, suffix + n, history().data() + start)) {
          const int64_t from = start + n, count = std::min(gamma, length - from);
          return {history().begin() + from, history().begin() + from + count};
        }
      }
    }
    return {};
  }

  int64_t vocab_, min_ngram_, max_ngram_;
  at::Device device_;
};

}  // namespace

std::shared_ptr<Drafter> model_drafter(std::shared_ptr<Model> model) {
  require(model != nullptr, "draft must be a model");
  return std::make_shared<ModelDrafter>(std::move(model));
}

std::shared_ptr<Drafter> unigram_drafter(const at::Tensor& unigram, const at::Device& device) {
  return std::make_shared<TableDrafter>(unigram, std::nullopt, device);
}

std::shared_ptr<Drafter> bigram_drafter(const at::Tensor& unigram, const at::Tensor& row_ptr,
                                        const at::Tensor& followers, const at::Tensor& counts,
                                        const at::Device& device) {
  return std::make_shared<TableDrafter>(unigram, std::array<at::Tensor, 3>{row_ptr, followers, counts}, device);
}

std::shared_ptr<Drafter> prompt_lookup_drafter(int64_t vocab_size, int64_t min_ngram, int64_t max_ngram,
                                               const at::Device& device) {
  return std::make_shared<PromptLookupDrafter>(vocab_size, min_ngram, max_ngram, device);
}

}  // namespace speculant
