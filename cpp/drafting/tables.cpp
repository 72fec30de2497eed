#include "drafting/tables.h"

#include <array>
#include <numeric>
#include <optional>

#include "errors.h"
#include "math/step.h"

namespace speculant {
namespace {

class TableDrafter final : public SequenceDrafter {
 public:
  TableDrafter(const at::Tensor& unigram, std::optional<std::array<at::Tensor, 3>> bigram, const at::Device& device)
      : SequenceDrafter(DrafterFacts{bigram ? "bigram" : "unigram", unigram.numel(), device}), device_(device) {
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

  Proposal propose(const std::vector<int64_t>& context, int64_t gamma, const SamplingConfig& config,
                   at::Generator& generator) override {
    Proposal out;
    std::vector<at::Tensor> x_rows, q_rows;
    int64_t previous = context.back();
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

  // A table scores any continuation: its row after the path's last token, standardized as a draft model's.
  at::Tensor laws(const std::vector<int64_t>& context, const std::vector<std::vector<int64_t>>& paths,
                  const SamplingConfig& config, at::Tensor* scores) override {
    std::vector<at::Tensor> rows;
    for (const auto& path : paths) rows.push_back(logits_after(path.empty() ? context.back() : path.back()));
    *scores = at::cat(rows);  // [n, V] log probabilities
    return standardize(*scores, config);
  }

 private:
  bool bigram() const { return row_ptr_.defined(); }

  // log q(. | previous) [1, V] on the device, kept once built (a row costs about ten tensor operations, more than
  // the draw from it) while the kept rows hold at most kCachedFloats values
  at::Tensor logits_after(int64_t previous) {
    if (!bigram()) return log_unigram_;
    if (rows_.empty()) rows_.resize(unigram_.numel());
    at::Tensor& kept = rows_[previous];
    if (kept.defined()) return kept;
    at::Tensor row = build_row(previous);
    if (cached_ + row.numel() <= kCachedFloats) {
      kept = row;
      cached_ += row.numel();
    }
    return row;
  }

  at::Tensor build_row(int64_t previous) const {
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

  static constexpr int64_t kCachedFloats = int64_t{1} << 24;  // 64 MB of float rows

  at::Device device_;
  at::Tensor unigram_, log_unigram_, row_ptr_, followers_, counts_;
  std::vector<at::Tensor> rows_;  // [V] the rows built so far (undefined: not yet, or past the budget)
  int64_t cached_ = 0;            // floats held in rows_
};

}  // namespace

std::shared_ptr<Drafter> unigram_drafter(const at::Tensor& unigram, const at::Device& device) {
  return std::make_shared<TableDrafter>(unigram, std::nullopt, device);
}

std::shared_ptr<Drafter> bigram_drafter(const at::Tensor& unigram, const at::Tensor& row_ptr,
                                        const at::Tensor& followers, const at::Tensor& counts,
                                        const at::Device& device) {
  return std::make_shared<TableDrafter>(unigram, std::array<at::Tensor, 3>{row_ptr, followers, counts}, device);
}

}  // namespace speculant
