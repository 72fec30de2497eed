#include "models/native_rows.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "errors.h"
#include "device/upload.h"

namespace speculant {
namespace {

// The rows' ids as one [R, W] tensor: a view of a lone row's (no copy to launch).
at::Tensor stacked(const std::vector<at::Tensor>& ids) {
  return ids.size() == 1 ? ids[0].unsqueeze(0) : at::stack(ids);
}

// A call's layout, positions [R, W] | slots [R, W] | row [R, 1] (one upload, or one copy into a graph's buffer),
// taken apart; a step call's has a last column, each row's last new token [R, 1] (extend_then).
struct CallLayout {
  CallLayout(const at::Tensor& layout, int64_t width)
      : row(layout.select(1, 2 * width)), positions(layout.narrow(1, 0, width)),
        slots(layout.narrow(1, width, width)) {}
  at::Tensor row, positions, slots;
};

// Each row's logits after its last new token: [R, V] from logits [R, W, V] and the layout's last column.
at::Tensor last_logits(const at::Tensor& logits, const at::Tensor& layout, int64_t width) {
  if (width == 1) return logits.select(1, 0);
  const at::Tensor last = layout.narrow(1, 2 * width + 1, 1).unsqueeze(-1).expand({-1, 1, logits.size(2)});
  return logits.gather(1, last).squeeze(1);
}

class NativeRows final : public ModelRows {
 public:
  NativeRows(RowsCall call, int64_t count, int64_t max_length, at::Device device, std::string source, Shapes shapes,
             GraphCache* graphs, TreeCalls tree, std::shared_ptr<std::vector<int64_t>> lengths)
      : call_(std::move(call)),
        shared_lengths_(lengths ? std::move(lengths) : std::make_shared<std::vector<int64_t>>()),
        lengths_(*shared_lengths_), max_length_(max_length), device_(device), source_(std::move(source)),
        shapes_(shapes), graphs_(graphs), tree_(std::move(tree)), tentative_(count) {
    lengths_.assign(count, 0);
  }

  int64_t count() const override { return static_cast<int64_t>(lengths_.size()); }
  void encode(const std::vector<at::Tensor>& sources) override {
    require(static_cast<bool>(tree_.encode) && sources.size() == 1, "model {}: batched calls of an "
            "encoder-decoder module are not supported (one row's tree calls over one source are)", source_);
    tree_.encode(sources[0]);
    lengths_[0] = 0;
    tentative_[0].clear();
  }
  void reset(const std::vector<at::Tensor>& tokens) override {
    std::fill(lengths_.begin(), lengths_.end(), 0);
    for (auto& nodes : tentative_) nodes.clear();
    std::vector<at::Tensor> some(tokens.size());
    for (size_t r = 0; r < tokens.size(); ++r) some[r] = tokens[r].numel() > 0 ? tokens[r] : at::Tensor();
    run(some, /*step=*/false);
  }
  std::vector<at::Tensor> extend(const std::vector<at::Tensor>& tokens) override { return run(tokens, true).logits; }
  bool fixed_shapes() const override { return shapes_ != Shapes::dynamic; }
  at::Tensor extend_then(const std::vector<at::Tensor>& tokens, const std::vector<at::Tensor>& inputs, const Then& then,
                         const std::string& what) override {
    require(fixed_shapes(), "model {}: extend_then needs fixed shapes", source_);
    return run(tokens, true, &then, &inputs, what).then;
  }
  void truncate(int64_t row, int64_t length) override {
    lengths_[row] = length;
    tentative_[row].clear();
  }
  int64_t length(int64_t row) const override { return lengths_[row]; }

  std::vector<at::Tensor> extend_tree(const std::vector<at::Tensor>& tokens,
                                      const std::vector<TreeNodes>& nodes) override {
    return run_tree(tokens, nodes).logits;
  }
  at::Tensor extend_tree_then(const std::vector<at::Tensor>& tokens, const std::vector<TreeNodes>& nodes,
                              const std::vector<at::Tensor>& inputs, const Then& then,
                              const std::string& what) override {
    require(fixed_shapes(), "model {}: extend_tree_then needs fixed shapes", source_);
    return run_tree(tokens, nodes, &then, &inputs, what).then;
  }
  void commit(const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& paths) override {
    for (size_t i = 0; i < rows.size(); ++i) tentative_[rows[i]].check_path(paths[i], rows[i]);
    gather(rows, paths);
    for (size_t i = 0; i < rows.size(); ++i) {
      lengths_[rows[i]] += static_cast<int64_t>(paths[i].size());
      tentative_[rows[i]].clear();
    }
  }

  void prune(int64_t row, const std::vector<int64_t>& nodes) override {
    tentative_[row].keep(nodes, row);
    gather({row}, {nodes});
  }

 private:
  // Moves each row rows[i]'s tentative nodes nodes[i] (ascending) to tentative places 0, 1, ... with one
  // copy_slots call for every row's nodes not already in place. Rows with fewer moves than the most repeat their
  // first move: the same value written to the same slot again.
  void gather(const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& nodes) {
    std::vector<int64_t> moving;                    // the rows with a move
    std::vector<std::vector<int64_t>> moves;        // their indices whose node is not already in place
    int64_t m = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      std::vector<int64_t> out_of_place;
      for (size_t j = 0; j < nodes[i].size(); ++j) {
        if (nodes[i][j] != static_cast<int64_t>(j)) out_of_place.push_back(static_cast<int64_t>(j));
      }
      if (out_of_place.empty()) continue;
      m = std::max(m, static_cast<int64_t>(out_of_place.size()));
      moving.push_back(static_cast<int64_t>(i));
      moves.push_back(std::move(out_of_place));
    }
    if (moving.empty()) return;
    require(static_cast<bool>(tree_.copy), "model {}: has no tree calls (copy_slots)", source_);
    const auto count = static_cast<int64_t>(moving.size());
    std::vector<int64_t> layout(count * (2 * m + 1));  // row i: sources [m] | destinations [m] | row
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row = rows[moving[i]], length = lengths_[row];
      int64_t* cell = layout.data() + i * (2 * m + 1);
      for (int64_t j = 0; j < m; ++j) {
        const int64_t move = j < static_cast<int64_t>(moves[i].size()) ? moves[i][j] : moves[i][0];
        cell[j] = length + nodes[moving[i]][move];
        cell[m + j] = length + move;
      }
      cell[2 * m] = row;
    }
    const at::Tensor on_device = upload(layout, device_).view({count, 2 * m + 1});
    tree_.copy(on_device.select(1, 2 * m), on_device.narrow(1, 0, m), on_device.narrow(1, m, m));
  }

  struct Ran {
    std::vector<at::Tensor> logits;  // each row's [k, V] (undefined for rows not in the call)
    at::Tensor then;                 // extend_then's result
  };

  // One tree call (extend_tree) for the rows with tokens (every row with fixed shapes); with `then` (fixed
  // shapes): then(every row's logits, *inputs) inside the call.
  Ran run_tree(const std::vector<at::Tensor>& tokens, const std::vector<TreeNodes>& nodes, const Then* then = nullptr,
               const std::vector<at::Tensor>* inputs = nullptr, const std::string& what = "") {
    require(static_cast<bool>(tree_.masked), "model {}: has no tree calls (extend_rows_masked)", source_);
    const bool fixed = shapes_ != Shapes::dynamic;
    std::vector<int64_t> rows;
    int64_t width = 0, keys = 1;
    for (size_t r = 0; r < tokens.size(); ++r) {
      if (!tokens[r].defined()) {
        if (fixed) rows.push_back(static_cast<int64_t>(r));  // all padding
        continue;
      }
      rows.push_back(static_cast<int64_t>(r));
      const int64_t k = tokens[r].numel(), end = lengths_[r] + tentative_[r].size() + k;
      require(end <= max_length_, "model {}: row {} holds {} cached + {} tree positions, more than max_length = {}",
              source_, r, lengths_[r], end - lengths_[r], max_length_);
      width = std::max(width, k);
      keys = std::max(keys, end);
    }
    Ran out{std::vector<at::Tensor>(tokens.size()), at::Tensor()};
    require(width > 0 || then == nullptr, "model {}: extend_tree_then with no tokens", source_);
    if (width == 0) return out;
    if (fixed) keys = bucket(keys);
    const auto count = static_cast<int64_t>(rows.size());
    at::Tensor layout = host_buffer({count, 2 * width + 1}, at::kLong, device_);  // positions | slots | row
    at::Tensor mask = host_buffer({count, width, keys}, at::kBool, device_).zero_();
    int64_t* cell = layout.data_ptr<int64_t>();
    bool* seen = mask.data_ptr<bool>();
    std::vector<at::Tensor> ids(count);
    at::Tensor padding;  // the ids of a row sitting the call out (fixed shapes), one tensor for all of them
    for (int64_t i = 0; i < count; ++i, cell += 2 * width + 1) {
      const int64_t r = rows[i], k = tokens[r].defined() ? tokens[r].numel() : 0, length = lengths_[r];
      const int64_t first = tentative_[r].size();
      if (k > 0) {
        const TreeNodes& tree = nodes[r];
        require(static_cast<int64_t>(tree.offsets.size()) == k && static_cast<int64_t>(tree.parents.size()) == k,
                "extend_tree: row {} has {} tokens but {} offsets and {} parents", r, k, tree.offsets.size(),
                tree.parents.size());
        tentative_[r].append(tree, length, cell, seen + i * width * keys, keys);
      }
      for (int64_t j = 0; j < width; ++j) {
        if (j < k) {
          cell[width + j] = length + first + j;  // node first + j's slot
          continue;
        }
        cell[j] = std::min(length, max_length_ - 1);  // padding: the scratch slot, seeing slot 0
        cell[width + j] = max_length_;
        seen[(i * width + j) * keys] = true;
      }
      cell[2 * width] = r;
      if (k == 0) {
        if (!padding.defined()) padding = at::zeros({width}, at::TensorOptions(device_).dtype(at::kLong));
        ids[i] = padding;
      } else {
        ids[i] = k < width ? at::constant_pad_nd(tokens[r], {0, width - k}, 0) : tokens[r];
      }
    }
    const GraphCache::Call call = [this, width, then](const std::vector<at::Tensor>& in) {
      const CallLayout parts(in[1], width);
      const at::Tensor logits = tree_.masked(in[0], parts.row, parts.positions, parts.slots, in[2]);
      if (then == nullptr) return logits;
      RECORD_USER_SCOPE("speculant::fused");  // benchmarks/overhead.py: what the call's graph replays with it
      return (*then)(logits, std::vector<at::Tensor>(in.begin() + 3, in.end()));
    };
    if (!fixed) {
      out.logits = split(call({stacked(ids), upload(layout, device_), upload(mask, device_)}), tokens, rows);
      return out;
    }
    // fixed shapes: the host's layout and mask straight into the graph's buffers (graphs.h)
    std::vector<at::Tensor> in{stacked(ids), layout, mask};
    if (then == nullptr) {
      out.logits = split(graphs_->run({width, true, keys}, in, call), tokens, rows);
    } else {
      in.insert(in.end(), inputs->begin(), inputs->end());
      const CallKey key{width, true, keys,
                        fmt::format("the {}-token tree call over {} slots, then {}", width, keys, what)};
      out.then = graphs_->run(key, in, call);
    }
    return out;
  }

  // Each row's logits [k_r, V] of a tree call's [R, W, V] (undefined for rows not in the call).
  static std::vector<at::Tensor> split(const at::Tensor& logits, const std::vector<at::Tensor>& tokens,
                                       const std::vector<int64_t>& rows) {
    std::vector<at::Tensor> out(tokens.size());
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t r = rows[i];
      if (tokens[r].defined()) out[r] = logits[static_cast<int64_t>(i)].narrow(0, 0, tokens[r].numel());
    }
    return out;
  }

  // One call for the rows with tokens (every row with fixed shapes); `step`: a decoding step (graphed shapes
  // replay it), not a prefill. With `then` (fixed shapes): then(last logits, *inputs) inside the call.
  Ran run(const std::vector<at::Tensor>& tokens, bool step, const Then* then = nullptr,
          const std::vector<at::Tensor>* inputs = nullptr, const std::string& what = "") {
    for (size_t r = 0; r < tokens.size(); ++r) {
      require(!tokens[r].defined() || tentative_[r].empty(), "model {}: row {} extended with tentative tree nodes "
              "uncommitted", source_, r);
    }
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
    Ran out{std::vector<at::Tensor>(tokens.size()), at::Tensor()};
    require(width > 0 || then == nullptr, "model {}: extend_then with no tokens", source_);
    if (width == 0) return out;
    if (fixed) keys = bucket(keys);
    const auto count = static_cast<int64_t>(rows.size());
    // positions [R, W] | slots [R, W] | row [R, 1] | last [R, 1], copied to the device at once (upload.h)
    at::Tensor layout = host_buffer({count, 2 * width + 2}, at::kLong, device_);
    int64_t* cell = layout.data_ptr<int64_t>();
    std::vector<at::Tensor> ids(count);
    at::Tensor padding;
    for (int64_t i = 0; i < count; ++i, cell += 2 * width + 2) {
      const int64_t r = rows[i], k = tokens[r].defined() ? tokens[r].numel() : 0;
      for (int64_t j = 0; j < width; ++j) {
        cell[j] = std::min(lengths_[r] + j, max_length_ - 1);  // padding: any existing position
        cell[width + j] = j < k ? lengths_[r] + j : max_length_;  // padding: the scratch slot
      }
      cell[2 * width] = r;
      cell[2 * width + 1] = std::max<int64_t>(k - 1, 0);
      if (k == 0) {
        if (!padding.defined()) padding = at::zeros({width}, at::TensorOptions(device_).dtype(at::kLong));
        ids[i] = padding;
      } else {
        ids[i] = k < width ? at::constant_pad_nd(tokens[r], {0, width - k}, 0) : tokens[r];
      }
    }
    at::Tensor logits;  // [R, W, V]
    if (!fixed || !step) {
      const CallLayout parts(upload(layout, device_), width);
      logits = call_(stacked(ids), parts.row, parts.positions, parts.slots, keys);
    } else if (then == nullptr) {  // the host's layout straight into the graph's buffer (graphs.h)
      const auto call = [this, width, keys](const std::vector<at::Tensor>& in) {
        const CallLayout parts(in[1], width);
        return call_(in[0], parts.row, parts.positions, parts.slots, keys);
      };
      logits = graphs_->run({width, false, keys}, {stacked(ids), layout}, call);
    } else {
      std::vector<at::Tensor> in{stacked(ids), layout};
      in.insert(in.end(), inputs->begin(), inputs->end());
      const CallKey key{width, false, keys,
                        fmt::format("the {}-token step call over {} slots, then {}", width, keys, what)};
      out.then = graphs_->run(key, in, [this, width, keys, then](const std::vector<at::Tensor>& in) {
        const CallLayout parts(in[1], width);
        const at::Tensor all = call_(in[0], parts.row, parts.positions, parts.slots, keys);
        RECORD_USER_SCOPE("speculant::fused");  // benchmarks/overhead.py: what the step's graph replays with it
        return (*then)(last_logits(all, in[1], width), std::vector<at::Tensor>(in.begin() + 2, in.end()));
      });
    }
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = rows[i];
      if (!tokens[r].defined()) continue;
      const int64_t k = tokens[r].numel();
      if (logits.defined()) out.logits[r] = logits[i].narrow(0, 0, k);  // [k, V]
      lengths_[r] += k;
    }
    return out;
  }

  // The slots a fixed-shape call reads when its rows end at `end`: the smallest power of two that holds them,
  // at least kSmallestBucket, at most max_length (native_rows.h).
  int64_t bucket(int64_t end) const {
    int64_t keys = kSmallestBucket;
    while (keys < end && keys < max_length_) keys *= 2;
    return std::min(keys, max_length_);
  }

  RowsCall call_;
  std::shared_ptr<std::vector<int64_t>> shared_lengths_;  // shared with the backend (its feature reads)
  std::vector<int64_t>& lengths_;
  int64_t max_length_;
  at::Device device_;
  std::string source_;
  Shapes shapes_;
  GraphCache* graphs_;
  TreeCalls tree_;
  std::vector<TentativeTree> tentative_;  // per row: its tentative tree nodes
};

}  // namespace

std::unique_ptr<ModelRows> native_rows(RowsCall call, int64_t count, int64_t max_length, at::Device device,
                                       std::string source, Shapes shapes, GraphCache* graphs, TreeCalls tree,
                                       std::shared_ptr<std::vector<int64_t>> lengths) {
  return std::make_unique<NativeRows>(std::move(call), count, max_length, device, std::move(source), shapes, graphs,
                                      std::move(tree), std::move(lengths));
}

}  // namespace speculant
