#include "native_rows.h"

#include <algorithm>
#include <vector>

#include "errors.h"

namespace speculant {
namespace {

class NativeRows final : public ModelRows {
 public:
  NativeRows(RowsCall call, int64_t count, int64_t max_length, at::Device device, std::string source, Shapes shapes,
             GraphCache* graphs)
      : call_(std::move(call)), lengths_(count, 0), max_length_(max_length), device_(device),
        source_(std::move(source)), shapes_(shapes), graphs_(graphs) {}

  int64_t count() const override { return static_cast<int64_t>(lengths_.size()); }
  void encode(const std::vector<at::Tensor>&) override {
    fail("model {}: batched calls of an encoder-decoder module are not supported", source_);
  }
  void reset(const std::vector<at::Tensor>& tokens) override {
    std::fill(lengths_.begin(), lengths_.end(), 0);
    std::vector<at::Tensor> some(tokens.size());
    for (size_t r = 0; r < tokens.size(); ++r) some[r] = tokens[r].numel() > 0 ? tokens[r] : at::Tensor();
    run(some, /*step=*/false);
  }
  std::vector<at::Tensor> extend(const std::vector<at::Tensor>& tokens) override { return run(tokens, true); }
  void truncate(int64_t row, int64_t length) override { lengths_[row] = length; }
  int64_t length(int64_t row) const override { return lengths_[row]; }

 private:
  // One call for the rows with tokens (every row with fixed shapes); `step`: a decoding step (graphed shapes
  // replay it), not a prefill.
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& tokens, bool step) {
    const bool fixed = shapes_ != Shapes::dynamic;
    std::vector<int64_t> rows;
    int64_t width = 0, keys = 0;
    for (size_t r = 0; r < tokens.size(); ++r) {
      if (!tokens[r].defined()) {
        if (fixed) rows.push_back(static_cast<int64_t>(r));
        continue;
      }
      rows.push_back(static_cast<int64_t>(r));
      const int64_t k = tokens[r].numel(), end = lengths_[r] + k;
      require(end <= max_length_, "model {}: row {} holds {} cached + {} new positions, more than max_length = {}",
              source_, r, lengths_[r], k, max_length_);
      width = std::max(width, k);
      keys = std::max(keys, end);
    }
    std::vector<at::Tensor> out(tokens.size());
    if (width == 0) return out;
    if (fixed) keys = max_length_;
    const auto count = static_cast<int64_t>(rows.size());
    // positions [R, W] | slots [R, W] | row [R, 1], copied to the device at once (from pinned memory on CUDA)
    at::Tensor layout = at::empty({count, 2 * width + 1}, at::TensorOptions().dtype(at::kLong).pinned_memory(
                                                              device_.is_cuda()));
    int64_t* cell = layout.data_ptr<int64_t>();
    std::vector<at::Tensor> ids(count);
    at::Tensor padding;
    for (int64_t i = 0; i < count; ++i, cell += 2 * width + 1) {
      const int64_t r = rows[i], k = tokens[r].defined() ? tokens[r].numel() : 0;
      for (int64_t j = 0; j < width; ++j) {
        cell[j] = std::min(lengths_[r] + j, max_length_ - 1);  // padding: any existing position
        cell[width + j] = j < k ? lengths_[r] + j : max_length_;  // padding: the scratch slot
      }
      cell[2 * width] = r;
      if (k == 0) {
        if (!padding.defined()) padding = at::zeros({width}, at::TensorOptions(device_).dtype(at::kLong));
        ids[i] = padding;
      } else {
        ids[i] = k < width ? at::constant_pad_nd(tokens[r], {0, width - k}, 0) : tokens[r];
      }
    }
    const at::Tensor on_device = layout.to(device_, /*non_blocking=*/true);
    const at::Tensor positions = on_device.narrow(1, 0, width), slots = on_device.narrow(1, width, width);
    const at::Tensor row_index = on_device.select(1, 2 * width);
    at::Tensor logits;  // [R, W, V]
    if (!fixed || !step) {
      logits = call_(at::stack(ids), row_index, positions, slots, keys);
    } else {
      logits = graphs_->run(width, {at::stack(ids), row_index, positions, slots},
                            [this](const std::vector<at::Tensor>& in) {
                              return call_(in[0], in[1], in[2], in[3], max_length_);
                            });
    }
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = rows[i];
      if (!tokens[r].defined()) continue;
      const int64_t k = tokens[r].numel();
      out[r] = logits[i].narrow(0, 0, k);  // [k, V]
      lengths_[r] += k;
    }
    return out;
  }

  RowsCall call_;
  std::vector<int64_t> lengths_;
  int64_t max_length_;
  at::Device device_;
  std::string source_;
  Shapes shapes_;
  GraphCache* graphs_;
};

}  // namespace

std::unique_ptr<ModelRows> native_rows(RowsCall call, int64_t count, int64_t max_length, at::Device device,
                                       std::string source, Shapes shapes, GraphCache* graphs) {
  return std::make_unique<NativeRows>(std::move(call), count, max_length, device, std::move(source), shapes, graphs);
}

}  // namespace speculant
