#include "rows.h"

#include "errors.h"
#include "model.h"

namespace speculant {
namespace {

class ReplicaRows final : public ModelRows {
 public:
  explicit ReplicaRows(std::vector<Model*> models) : models_(std::move(models)) {}

  int64_t count() const override { return static_cast<int64_t>(models_.size()); }
  void encode(const std::vector<at::Tensor>& sources) override {
    for (size_t r = 0; r < models_.size(); ++r) models_[r]->encode(sources[r]);
  }
  void reset(const std::vector<at::Tensor>& tokens) override {
    for (size_t r = 0; r < models_.size(); ++r) models_[r]->reset(tokens[r]);
  }
  std::vector<at::Tensor> extend(const std::vector<at::Tensor>& tokens) override {
    std::vector<at::Tensor> logits(models_.size());
    for (size_t r = 0; r < models_.size(); ++r) {
      if (tokens[r].defined()) logits[r] = models_[r]->extend(tokens[r]);
    }
    return logits;
  }
  void truncate(int64_t row, int64_t length) override { models_[row]->truncate(length); }
  int64_t length(int64_t row) const override { return models_[row]->length(); }

 private:
  std::vector<Model*> models_;
};

}  // namespace

std::unique_ptr<ModelRows> replica_rows(std::vector<Model*> models) {
  return std::make_unique<ReplicaRows>(std::move(models));
}

std::unique_ptr<ModelRows> Model::rows(int64_t count, Shapes shapes) {
  if (shapes != Shapes::dynamic) {
    const std::string why = fixed_shapes_obstacle();
    require(why.empty(), "model ({} form): has no fixed-shape calls: {}", form(), why);
  }
  while (static_cast<int64_t>(replicas_.size()) < count - 1) replicas_.push_back(replica());
  std::vector<Model*> models{this};
  for (int64_t r = 1; r < count; ++r) models.push_back(replicas_[r - 1].get());
  return replica_rows(std::move(models));
}

}  // namespace speculant
