#include "models/aoti_model.h"

#include <c10/core/InferenceMode.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/version.h>

#include <algorithm>
#include <unordered_map>

#include "errors.h"
#include "device/graphs.h"
#include "device/upload.h"

namespace speculant {
namespace {

using Metadata = std::unordered_map<std::string, std::string>;

int64_t positive_entry(const Metadata& metadata, const char* key, const std::string& path) {
  auto it = metadata.find(key);
  require(it != metadata.end(), "model {}: the .pt2 package has no '{}' metadata (speculant.export writes it)",
          path, key);
  try {
    int64_t value = std::stoll(it->second);
    require(value > 0, "model {}: metadata '{}' must be positive, got {}", path, key, value);
    return value;
  } catch (const std::logic_error&) {
    fail("model {}: metadata '{}' must be an integer, got '{}'", path, key, it->second);
  }
}

using Loader = torch::inductor::AOTIModelPackageLoader;

// Single-threaded runners: AOTInductor's default runner records an event after each run and queries or waits on
// it before the next, which a CUDA graph capture cannot hold; the single-threaded runner runs the kernels alone.
// A model runs one generation at a time (Model::in_use), and each replica has a runner of its own.
std::unique_ptr<Loader> open_model(const std::string& path, const char* name, std::optional<at::Device> device) {
  try {
    return std::make_unique<Loader>(path, name, /*run_single_threaded=*/true, /*num_runners=*/1,
                                    device && device->has_index() ? device->index() : c10::DeviceIndex(-1));
  } catch (const std::exception& e) {
    fail("model {}: AOTInductor could not load the package's model '{}': {}", path, name, e.what());
  }
}

class AotiModel final : public Model {
 public:
  AotiModel(const std::string& path, std::unique_ptr<Loader> loader, std::unique_ptr<Loader> encoder,
            const Metadata& metadata, at::Device device)
      : loader_(std::move(loader)), encoder_(std::move(encoder)), path_(path), package_metadata_(metadata) {
    vocab_size_ = positive_entry(metadata, "vocab_size", path);
    max_length_ = positive_entry(metadata, "max_length", path);
    encoder_decoder_ = encoder_ != nullptr;
    if (encoder_decoder_) max_source_length_ = positive_entry(metadata, "max_source_length", path);
    device_ = device;
    auto json = metadata.find("speculant.json");
    if (json != metadata.end()) metadata_ = json->second;
    auto trees = metadata.find("tree_calls");
    trees_ = trees != metadata.end() && trees->second == "1";
    read_feature_metadata(metadata);
    positions_ = at::arange(*max_length_, at::TensorOptions(device_).dtype(at::kLong));  // [M]
    no_move_ = positions_.narrow(0, 0, 1);                                               // [1] slot 0 to itself
    origin_ = std::vector<int64_t>(static_cast<size_t>(*max_length_));
    for (size_t i = 0; i < origin_.size(); ++i) origin_[i] = static_cast<int64_t>(i);
  }

  void encode(const at::Tensor& source) override {
    const int64_t s = source.numel();
    require(s <= *max_source_length_, "model {}: the source has {} tokens, more than max_source_length = {}",
            path_, s, *max_source_length_);
    try {
      encoded_ = encoder_->run({source.view({1, s})});  // [hidden, keys_0, values_0, ...]
    } catch (const c10::Error& e) {
      fail("model {}: the .pt2 encoder failed on {} token(s): {}", path_, s, e.what_without_backtrace());
    }
    length_ = 0;
  }
  void reset(const at::Tensor& tokens) override {
    length_ = 0;  // stale slots are masked: nothing to clear
    forget_moves(0);
    if (tokens.numel() > 0) run(tokens, /*step=*/false);
  }
  at::Tensor extend(const at::Tensor& tokens) override { return run(tokens, /*step=*/true); }
  void truncate(int64_t length) override {
    length_ = length;
    forget_moves(length);
  }

  // Tree calls (packages with tree_calls = 1): the mask covers the cache's slots in use; the package's call
  // takes all M, the rest hidden.
  std::string tree_obstacle() const override {
    return trees_ ? "" : "this .pt2 package has no tree calls: it was exported in the chain form (tree_calls=False), "
                         "its model has attention layers of a type without tree masks or does not apply its config's "
                         "window as they do (speculant/layer_masks.py), or it was exported before tree calls existed "
                         "(export it again)";
  }
  at::Tensor extend_masked(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& mask) override {
    require(trees_, "model {}: {}", path_, tree_obstacle());
    const int64_t k = tokens.numel();
    require(positions.numel() == k && mask.dim() == 2 && mask.size(0) == k && mask.size(1) == length_ + k,
            "model {}: extend_masked needs positions [{}] and mask [{}, {}]", path_, k, k, length_ + k);
    require(length_ + k <= *max_length_, "model {}: {} cached + {} new positions exceed max_length = {}", path_,
            length_, k, *max_length_);
    at::Tensor full = at::zeros({k, *max_length_}, mask.options().dtype(at::kBool));  // [k, M]
    full.narrow(1, 0, length_ + k).copy_(mask);
    return call(tokens, positions.to(at::kLong), full, /*step=*/true, /*tree=*/true);
  }
  // Moves are recorded here and made by the next call, before it writes (the package has no other entry).
  void keep(const at::Tensor& entries) override {
    const at::Tensor host = entries.to(at::kCPU, at::kLong).contiguous();
    const int64_t* e = host.const_data_ptr<int64_t>();
    const int64_t kept = host.numel();
    require(kept <= length_ && (kept == 0 || e[kept - 1] < length_), "model {}: keep: entries past the {} cached",
            path_, length_);
    std::vector<int64_t> origin(static_cast<size_t>(kept));
    for (int64_t i = 0; i < kept; ++i) origin[i] = origin_[e[i]];  // what slot e[i] will hold, moves made
    forget_moves(0);
    for (int64_t i = 0; i < kept; ++i) {
      if (origin[i] == i) continue;
      origin_[i] = origin[i];
      moved_.push_back(i);
    }
    length_ = kept;
  }
  int64_t length() const override { return length_; }
  std::string form() const override { return "pt2"; }
  // Each call's shapes depend on its token count alone (the cache is static, cache_position a slice): fixed
  // shapes are its calls as they are, each decoding step's inputs copied into per-width buffers (graphs.h),
  // captured into a CUDA graph with graphed shapes. The package writes its cache in place, in its own buffers.
  std::string fixed_shapes_obstacle() const override {
    return encoder_decoder_ ? "an encoder-decoder package's decoder takes the encoded source, whose shape "
                              "changes with every source"
                            : "";
  }
  void use_shapes(Shapes shapes) override { shapes_ = shapes; }
  std::string graph_failure() const override { return graphed_.failure(); }
  int64_t graphs_captured() const override { return graphed_.captured(); }
  // Feature drafts: a package exported with features= keeps them per slot in its buffer `features` [M, F],
  // written by its calls and moved by their moves (pt2.py); the view is the package's.
  std::string features_obstacle() const override {
    if (feature_layers_) return "";
    if (encoder_decoder_) return "an encoder-decoder package: feature drafts draft decoder-only models";
    return "this .pt2 package keeps no features: export it with features=True (the LM head's input) or "
           "features=(layer, ...) (EAGLE-3)";
  }
  int64_t record_features(const std::optional<std::vector<int64_t>>& layers) override {
    if (!feature_layers_) Model::record_features(layers);
    if (!layers) return feature_width_;  // the package records always
    std::vector<int64_t> sorted = *layers;
    std::sort(sorted.begin(), sorted.end());
    require(sorted == *feature_layers_, "model {}: the package keeps the features of {}, not of {}: export it "
            "again with features= the draft's", path_, view_name(*feature_layers_), view_name(sorted));
    return feature_width_;
  }
  std::vector<at::Tensor> feature_weights() override {
    if (!feature_layers_) return Model::feature_weights();
    return {constant(feature_weight_names_.at(0)), constant(feature_weight_names_.at(1))};
  }

  // The cache lives in the loaded package's buffers: a replica loads the package again.
  std::shared_ptr<Model> replica() override {
    const std::optional<at::Device> where(device_);
    return std::make_shared<AotiModel>(path_, open_model(path_, "model", where),
                                       encoder_ ? open_model(path_, "encoder", where) : nullptr, package_metadata_,
                                       device_);
  }

 protected:
  // The committed entries' features: slot i holds what slot origin_[i] holds until the next call moves it.
  at::Tensor own_features() override {
    if (!feature_layers_) return Model::own_features();
    const at::Tensor features = constant("features");
    if (moved_.empty()) return features.narrow(0, 0, length_);  // no move pending: a view, nothing uploaded
    const std::vector<int64_t> slots(origin_.begin(), origin_.begin() + length_);
    return features.index_select(0, upload(slots, positions_.device()));
  }

 private:
  void read_feature_metadata(const Metadata& metadata) {
    auto layers = metadata.find("features");
    if (layers == metadata.end()) return;
    try {
      feature_layers_ = split_integers(layers->second);
    } catch (const std::logic_error&) {
      fail("model {}: metadata 'features' must be comma-separated layer indices, got '{}'", path_, layers->second);
    }
    feature_width_ = positive_entry(metadata, "feature_width", path_);
    auto names = metadata.find("feature_weights");
    require(names != metadata.end(), "model {}: the package has 'features' but no 'feature_weights' metadata",
            path_);
    const std::string& both = names->second;
    const size_t comma = both.find(',');
    require(comma != std::string::npos, "model {}: 'feature_weights' must name two constants, got '{}'", path_,
            both);
    feature_weight_names_ = {both.substr(0, comma), both.substr(comma + 1)};
  }
  static std::vector<int64_t> split_integers(const std::string& text) {
    std::vector<int64_t> out;
    size_t start = 0;
    while (start < text.size()) {
      const size_t end = std::min(text.find(',', start), text.size());
      out.push_back(std::stoll(text.substr(start, end - start)));
      start = end + 1;
    }
    return out;
  }
  static std::string view_name(const std::vector<int64_t>& layers) {
    return layers.empty() ? std::string("the LM head's input") : fmt::format("layers {}", fmt::join(layers, ", "));
  }
  // The package's constant (a weight or buffer, its own memory) named `names` or, for a tied weight, one of its
  // names joined by '|'.
  at::Tensor constant(const std::string& names) {
    if (constants_.empty()) constants_ = loader_->get_runner()->extract_constants_map(/*use_inactive=*/false);
    size_t start = 0;
    while (start <= names.size()) {
      const size_t end = std::min(names.find('|', start), names.size());
      auto it = constants_.find(names.substr(start, end - start));
      if (it != constants_.end()) return it->second;
      start = end + 1;
    }
    fail("model {}: the package has no constant named '{}'", path_, names);
  }

  // A prefill (step false) or a decoding step of k tokens after the cached ones.
  at::Tensor run(const at::Tensor& tokens, bool step) {
    const int64_t k = tokens.numel();
    require(length_ + k <= *max_length_, "model {}: {} cached + {} new positions exceed max_length = {}", path_,
            length_, k, *max_length_);
    if (!trees_) return call(tokens, at::Tensor(), at::Tensor(), step, false);
    const at::Tensor slots = positions_.narrow(0, length_, k);
    return call(tokens, slots, slots.unsqueeze(1) >= positions_.unsqueeze(0), step, false);  // causal [k, M]
  }

  // One call of the package at slots length_ .. length_ + k - 1: the chain form (position_ids undefined), or
  // the tree form with position_ids [k], mask [k, M] and the pending moves. With fixed or graphed shapes a
  // decoding step runs through the graph cache of its width, unless cache moves are pending (their count
  // changes the inputs' shapes: such a call runs as it is, as prefills do).
  at::Tensor call(const at::Tensor& tokens, const at::Tensor& position_ids, const at::Tensor& mask, bool step,
                  bool tree) {
    const int64_t k = tokens.numel();
    std::vector<at::Tensor> inputs{tokens.view({1, k}), positions_.narrow(0, length_, k)};
    if (trees_) {
      at::Tensor source = no_move_, dest = no_move_;
      if (!moved_.empty()) {
        std::vector<int64_t> from;
        for (const int64_t slot : moved_) from.push_back(origin_[slot]);
        source = upload(from, positions_.device());
        dest = upload(moved_, positions_.device());
      }
      inputs.insert(inputs.end(), {position_ids, mask, source, dest});
    }
    inputs.insert(inputs.end(), encoded_.begin(), encoded_.end());  // encoder-decoder: the cross inputs
    GraphCache* graphs = shapes_ == Shapes::graphed ? &graphed_ : shapes_ == Shapes::fixed ? &fixed_ : nullptr;
    const GraphCache::Call package = [this, k](const std::vector<at::Tensor>& in) { return run_package(in, k); };
    const at::Tensor logits = graphs != nullptr && step && moved_.empty() && !encoder_decoder_
                                  ? graphs->run(CallKey{k, tree, *max_length_}, inputs, package)
                                  : package(inputs);
    forget_moves(0);  // made
    length_ += k;
    return logits.squeeze(0);  // [k, V]
  }

  // The package's model on `inputs` (k tokens): its logits [1, k, V], checked.
  at::Tensor run_package(const std::vector<at::Tensor>& inputs, int64_t k) {
    std::vector<at::Tensor> outputs;
    try {
      outputs = loader_->run(inputs);
    } catch (const c10::Error& e) {
      fail("model {}: the .pt2 model failed on {} token(s) at position {}: {}", path_, k, length_,
           e.what_without_backtrace());
    }
    require(outputs.size() == 1, "model {}: the .pt2 model must return one tensor (logits), got {}", path_,
            outputs.size());
    const at::Tensor& logits = outputs[0];
    require(logits.dim() == 3 && logits.size(0) == 1 && logits.size(1) == k && logits.size(2) == vocab_size_,
            "model {}: on {} token(s) the .pt2 model must return logits [1, {}, {}], got [{}]", path_, k, k,
            vocab_size_, fmt::join(logits.sizes(), ", "));
    return logits;
  }

  // Drops the recorded moves into slots >= from (all of them: 0).
  void forget_moves(int64_t from) {
    std::vector<int64_t> still;
    for (const int64_t slot : moved_) {
      if (slot < from) {
        still.push_back(slot);
      } else {
        origin_[slot] = slot;
      }
    }
    moved_ = std::move(still);
  }

  std::unique_ptr<Loader> loader_;
  std::unique_ptr<Loader> encoder_;   // encoder-decoder packages only
  std::vector<at::Tensor> encoded_;   // the encoder's outputs for the current source
  std::string path_;
  Metadata package_metadata_;
  at::Tensor positions_;  // [max_length] 0, 1, ...: cache_position is a slice, no allocation per call
  int64_t length_ = 0;
  bool trees_ = false;             // the package's model has the tree form (pt2.py)
  at::Tensor no_move_;             // [1] slot 0: the move that moves nothing
  std::vector<int64_t> origin_;    // per slot: the slot whose entry it will hold once the moves are made
  std::vector<int64_t> moved_;     // the slots whose origin is another
  Shapes shapes_ = Shapes::dynamic;
  GraphCache fixed_{false, nullptr}, graphed_{true, nullptr};  // per-width buffers (and graphs) of the steps
  std::optional<std::vector<int64_t>> feature_layers_;  // the view the package keeps (empty: the LM head's input)
  int64_t feature_width_ = 0;
  std::vector<std::string> feature_weight_names_;  // the constants: input embedding, LM head
  std::unordered_map<std::string, at::Tensor> constants_;  // the package's, read once
};

}  // namespace

std::shared_ptr<Model> load_pt2_file(const std::string& path, std::optional<at::Device> device) {
  Metadata metadata;
  try {
    metadata = torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(path, "model");
  } catch (const std::exception& e) {
    fail("model {}: is not a readable AOTInductor package with a model named 'model': {}", path, e.what());
  }
  auto built_torch = metadata.find("torch_version");
  require(built_torch == metadata.end() || built_torch->second == TORCH_VERSION,
          "model {}: the .pt2 package was compiled with torch {}, this is torch {}; AOTInductor packages hold "
          "machine code for one torch: export the model again with this torch",
          path, built_torch == metadata.end() ? "" : built_torch->second, TORCH_VERSION);
  auto key = metadata.find("AOTI_DEVICE_KEY");
  const at::Device built(key == metadata.end() ? "cpu" : key->second);
  if (device) {
    require(device->type() == built.type(), "model {}: the .pt2 package was compiled for {}, not {}; AOTInductor "
            "packages hold machine code for one device type: export the model again on {}", path,
            built.str(), device->str(), device->str());
  }
  require(!built.is_cuda() || at::hasCUDA(), "model {}: the .pt2 package was compiled for CUDA, and no CUDA "
          "device is available here", path);
  std::unique_ptr<Loader> loader = open_model(path, "model", device);
  std::unique_ptr<Loader> encoder;
  if (metadata.count("max_source_length")) encoder = open_model(path, "encoder", device);
  at::Device where = device ? *device : built;
  auto model = std::make_shared<AotiModel>(path, std::move(loader), std::move(encoder), metadata, where);
  c10::InferenceMode inference_mode;
  at::Tensor one = at::zeros({1}, at::TensorOptions(where).dtype(at::kLong));
  if (model->encoder_decoder()) model->encode(one);
  model->reset(one);
  model->extend(one);  // checks the logits' shape
  model->truncate(0);
  return model;
}

}  // namespace speculant
