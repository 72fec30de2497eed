#include "models/rows.h"

#include <algorithm>
#include <numeric>

#include "errors.h"
#include "models/model.h"
#include "device/upload.h"

namespace speculant {
namespace {

class ReplicaRows final : public ModelRows {
 public:
  explicit ReplicaRows(std::vector<Model*> models) : models_(std::move(models)), tentative_(models_.size()) {}

  int64_t count() const override { return static_cast<int64_t>(models_.size()); }
  void encode(const std::vector<at::Tensor>& sources) override {
    for (size_t r = 0; r < models_.size(); ++r) models_[r]->encode(sources[r]);
  }
  void reset(const std::vector<at::Tensor>& tokens) override {
    for (size_t r = 0; r < models_.size(); ++r) {
      models_[r]->reset(tokens[r]);
      tentative_[r].clear();
    }
  }
  std::vector<at::Tensor> extend(const std::vector<at::Tensor>& tokens) override {
    std::vector<at::Tensor> logits(models_.size());
    for (size_t r = 0; r < models_.size(); ++r) {
      if (!tokens[r].defined()) continue;
      require(tentative_[r].empty(), "row {} extended with tentative tree nodes uncommitted", r);
      logits[r] = models_[r]->extend(tokens[r]);
    }
    return logits;
  }
  void truncate(int64_t row, int64_t length) override {
    models_[row]->truncate(length);
    tentative_[row].clear();
  }
  int64_t length(int64_t row) const override { return models_[row]->length() - tentative_[row].size(); }

  // Each row's nodes in one extend_masked call of its model (mask over its cache entries and the new ones).
  std::vector<at::Tensor> extend_tree(const std::vector<at::Tensor>& tokens,
                                      const std::vector<TreeNodes>& nodes) override {
    std::vector<at::Tensor> logits(models_.size());
    for (size_t r = 0; r < models_.size(); ++r) {
      if (!tokens[r].defined()) continue;
      const int64_t k = tokens[r].numel(), committed = length(static_cast<int64_t>(r));
      const TreeNodes& tree = nodes[r];
      require(static_cast<int64_t>(tree.offsets.size()) == k && static_cast<int64_t>(tree.parents.size()) == k,
              "extend_tree: row {} has {} tokens but {} offsets and {} parents", r, k, tree.offsets.size(),
              tree.parents.size());
      const int64_t entries = models_[r]->length() + k;
      const at::Device device = tokens[r].device();
      at::Tensor positions = host_buffer({k}, at::kLong, device);
      at::Tensor mask = host_buffer({k, entries}, at::kBool, device).zero_();
      tentative_[r].append(tree, committed, positions.data_ptr<int64_t>(), mask.data_ptr<bool>(), entries);
      logits[r] = models_[r]->extend_masked(tokens[r], upload(positions, device), upload(mask, device));
    }
    return logits;
  }
  // The committed entries, then the path's, in one keep call.
  void commit(const std::vector<int64_t>& rows, const std::vector<std::vector<int64_t>>& paths) override {
    for (size_t i = 0; i < rows.size(); ++i) {  // a model per row: a keep call each
      tentative_[rows[i]].check_path(paths[i], rows[i]);
      keep(rows[i], length(rows[i]), paths[i]);
      tentative_[rows[i]].clear();
    }
  }
  // The committed entries, then the kept nodes', in one keep call.
  void prune(int64_t row, const std::vector<int64_t>& nodes) override {
    const int64_t committed = length(row);
    tentative_[row].keep(nodes, row);
    keep(row, committed, nodes);
  }

 private:
  // Keeps the `length` committed entries, then the given tentative nodes', in one keep call.
  void keep(int64_t row, int64_t length, const std::vector<int64_t>& nodes) {
    std::vector<int64_t> entries(length);
    std::iota(entries.begin(), entries.end(), 0);
    for (const int64_t node : nodes) entries.push_back(length + node);
    models_[row]->keep(upload(entries, models_[row]->device()));
  }

  std::vector<Model*> models_;
  std::vector<TentativeTree> tentative_;
};

}  // namespace

void TentativeTree::append(const ModelRows::TreeNodes& nodes, int64_t length, int64_t* positions, bool* visible,
                           int64_t stride) {
  for (size_t j = 0; j < nodes.parents.size(); ++j) {
    const int64_t node = size(), parent = nodes.parents[j];
    require(parent >= -1 && parent < node, "extend_tree: node {} has parent {}, not an earlier tentative node",
            node, parent);
    parents_.push_back(parent);
    positions[j] = length + nodes.offsets[j];
    bool* row = visible + static_cast<int64_t>(j) * stride;
    std::fill(row, row + length, true);  // the committed entries
    for (int64_t up = node; up >= 0; up = parents_[up]) row[length + up] = true;  // itself and its ancestors
  }
}

void TentativeTree::check_path(const std::vector<int64_t>& path, int64_t row) const {
  for (size_t i = 0; i < path.size(); ++i) {
    require(path[i] >= 0 && path[i] < size() && parents_[path[i]] == (i == 0 ? -1 : path[i - 1]),
            "commit: row {}'s path does not go down its tree of tentative nodes", row);
  }
}

void TentativeTree::keep(const std::vector<int64_t>& nodes, int64_t row) {
  std::vector<int64_t> renumbered(parents_.size(), -1), parents;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const int64_t node = nodes[i];
    require(node >= 0 && node < size() && (i == 0 || node > nodes[i - 1]),
            "prune: row {}'s nodes must be ascending tentative nodes (0 .. {}), got {} at {}", row, size() - 1, node, i);
    const int64_t parent = parents_[node];
    require(parent == -1 || renumbered[parent] >= 0, "prune: row {} keeps node {} but not its parent {}", row, node,
            parent);
    renumbered[node] = static_cast<int64_t>(i);
    parents.push_back(parent == -1 ? -1 : renumbered[parent]);
  }
  parents_ = std::move(parents);
}

at::Tensor Model::extend_masked(const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  fail("model ({} form): {}", form(), tree_obstacle());
}

void Model::keep(const at::Tensor&) { fail("model ({} form): {}", form(), tree_obstacle()); }

int64_t Model::record_features(const std::optional<std::vector<int64_t>>&) {
  fail("model ({} form): {}", form(), features_obstacle());
}
at::Tensor Model::features(int64_t row) {
  if (row == 0) return own_features();
  require(row > 0 && row <= static_cast<int64_t>(replicas_.size()), "model ({} form): row {} of a batch of {}",
          form(), row, replicas_.size() + 1);
  return replicas_[row - 1]->own_features();
}
at::Tensor Model::own_features() { fail("model ({} form): {}", form(), features_obstacle()); }
std::vector<at::Tensor> Model::feature_weights() { fail("model ({} form): {}", form(), features_obstacle()); }

std::vector<at::Tensor> ModelRows::extend_tree(const std::vector<at::Tensor>&, const std::vector<TreeNodes>&) {
  fail("this model's rows have no tree calls (Model::tree_obstacle says why)");
}

void ModelRows::commit(const std::vector<int64_t>&, const std::vector<std::vector<int64_t>>&) {
  fail("this model's rows have no tree calls (Model::tree_obstacle says why)");
}

at::Tensor ModelRows::extend_then(const std::vector<at::Tensor>&, const std::vector<at::Tensor>&, const Then&,
                                  const std::string&) {
  fail("these model rows have no fixed-shape step calls to run a step's later work in");
}

at::Tensor ModelRows::extend_tree_then(const std::vector<at::Tensor>&, const std::vector<TreeNodes>&,
                                       const std::vector<at::Tensor>&, const Then&, const std::string&) {
  fail("these model rows have no fixed-shape tree calls to run a call's later work in");
}

void ModelRows::prune(int64_t, const std::vector<int64_t>&) {
  fail("this model's rows have no tree calls (Model::tree_obstacle says why)");
}

std::unique_ptr<ModelRows> replica_rows(std::vector<Model*> models) {
  return std::make_unique<ReplicaRows>(std::move(models));
}

std::unique_ptr<ModelRows> Model::tree_rows(int64_t count, Shapes shapes) {
  // An encoder-decoder's tree calls serve beam search (one row over one source); tree= checks tree_obstacle first.
  const std::string why = encoder_decoder() ? beam_obstacle() : tree_obstacle();
  require(why.empty(), "model ({} form): {}", form(), why);
  return rows(count, shapes);  // row replicas with extend_masked / keep
}

std::unique_ptr<ModelRows> Model::rows(int64_t count, Shapes shapes) {
  if (shapes != Shapes::dynamic) {
    const std::string why = fixed_shapes_obstacle();
    require(why.empty(), "model ({} form): has no fixed-shape calls: {}", form(), why);
  }
  while (static_cast<int64_t>(replicas_.size()) < count - 1) replicas_.push_back(replica());
  std::vector<Model*> models{this};
  for (int64_t r = 1; r < count; ++r) models.push_back(replicas_[r - 1].get());
  for (Model* model : models) model->use_shapes(shapes);
  return replica_rows(std::move(models));
}

at::Tensor restart_row(ModelRows& rows, int64_t row, const at::Tensor& pending, int64_t length, const at::Tensor& t) {
  const int64_t cached = rows.length(row);
  require(length >= 1 && length <= cached + pending.numel(), "restart: length {} is outside [1, {}]", length,
          cached + pending.numel());
  if (length <= cached) {
    rows.truncate(row, length);
    return t;
  }
  return at::cat({pending.narrow(0, 0, length - cached), t});
}

}  // namespace speculant
