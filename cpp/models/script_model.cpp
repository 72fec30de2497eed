// TorchScript backends of Model: the cached form calls the module's own cache methods, the plain form keeps
// the token history and recomputes it.
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <functional>
#include <sstream>

#include "errors.h"
#include "models/model.h"
#include "models/native_rows.h"

namespace speculant {
namespace {

at::Tensor as_batch(const at::Tensor& tokens) { return tokens.view({1, tokens.numel()}); }  // [1, k]

// logits returned by the module for `rows` rows of k input tokens -> [rows, k, V], checked against the contract.
at::Tensor checked_logits(const c10::IValue& output, int64_t rows, int64_t k, int64_t vocab,
                          const std::string& source, const char* method) {
  require(output.isTensor(), "model {}: {}() must return a Tensor of logits, got {}", source, method,
          output.tagKind());
  const at::Tensor& logits = output.toTensor();
  require(logits.dim() == 3 && logits.size(0) == rows && logits.size(1) == k && logits.size(2) == vocab,
          "model {}: {}() on {} row(s) of {} token(s) must return logits [{}, {}, {}], got [{}]", source, method,
          rows, k, rows, k, vocab, fmt::join(logits.sizes(), ", "));
  require(at::isFloatingType(logits.scalar_type()), "model {}: {}() must return floating-point logits, got {}",
          source, method, std::string(c10::toString(logits.scalar_type())));
  return logits;
}

// logits for k tokens of batch 1 -> [k, V].
at::Tensor checked_logits(const c10::IValue& output, int64_t k, int64_t vocab, const std::string& source,
                          const char* method) {
  return checked_logits(output, 1, k, vocab, source, method).squeeze(0);
}

std::optional<int64_t> int_attribute(const torch::jit::Module& module, const char* name,
                                     const std::string& source) {
  if (!module.hasattr(name)) return std::nullopt;
  c10::IValue value = module.attr(name);
  require(value.isInt(), "model {}: attribute `{}` must be an int, got {}", source, name, value.tagKind());
  return value.toInt();
}

bool has_method(const torch::jit::Module& module, const char* name) {
  return module.find_method(name).has_value();
}

at::Device module_device(const torch::jit::Module& module) {
  for (const at::Tensor& t : module.parameters()) return t.device();
  for (const at::Tensor& t : module.buffers()) return t.device();
  return at::kCPU;
}

class CachedScriptModel final : public Model {
 public:
  CachedScriptModel(torch::jit::Module module, std::string source, std::string metadata)
      : module_(std::move(module)), source_(std::move(source)) {
    metadata_ = std::move(metadata);
    auto vocab = int_attribute(module_, "vocab_size", source_);
    require(vocab.has_value(), "model {}: the cached form needs an int attribute `vocab_size`", source_);
    require(*vocab > 0, "model {}: vocab_size must be positive, got {}", source_, *vocab);
    vocab_size_ = *vocab;
    auto max_length = int_attribute(module_, "max_length", source_);
    if (max_length && *max_length > 0) max_length_ = *max_length;
    encoder_decoder_ = has_method(module_, "encode");
    auto max_source = int_attribute(module_, "max_source_length", source_);
    if (max_source && *max_source > 0) max_source_length_ = *max_source;
    device_ = module_device(module_);
    batched_ = !encoder_decoder_ && has_method(module_, "start_rows") && has_method(module_, "extend_rows") &&
               max_length_.has_value();
    const bool masked = has_method(module_, "extend_rows_masked") && has_method(module_, "copy_slots");
    tree_ = batched_ && masked;
    source_tree_ = encoder_decoder_ && masked && has_method(module_, "start_rows") &&
                   has_method(module_, "extend_rows") && max_length_.has_value();
    features_ = batched_ && has_method(module_, "record_features") && has_method(module_, "features") &&
                has_method(module_, "feature_weights");
  }

  bool batched() const override { return batched_; }
  // Batches run natively (one extend_rows call per step); batch 1 runs the module's own cache unless the
  // shapes are fixed.
  std::unique_ptr<ModelRows> rows(int64_t count, Shapes shapes) override {
    if (!batched_ || (count == 1 && shapes == Shapes::dynamic)) {
      row_lengths_.reset();  // batch 1 runs the module's own cache
      return Model::rows(count, shapes);
    }
    start_rows(count);
    return native_rows(rows_call(), count, *max_length_, device_, source_, shapes,
                       shapes == Shapes::graphed ? &graphed_ : &fixed_, {}, fresh_lengths());
  }
  std::string tree_obstacle() const override {
    if (tree_) return "";
    if (source_tree_) {
      return "an encoder-decoder module's tree calls hold one row over one encoded source: they serve beam search "
             "(num_beams), not tree= decoding";
    }
    if (!batched_) return fixed_shapes_obstacle();
    return "the module has no extend_rows_masked / copy_slots methods (model.h); re-export it with this version "
           "of speculant.export, which writes them";
  }
  std::string beam_obstacle() const override {
    if (!encoder_decoder_) return tree_obstacle();
    if (source_tree_) return "";
    return "the module has no start_rows / extend_rows / extend_rows_masked / copy_slots methods (model.h); "
           "re-export it with this version of speculant.export, which writes them";
  }
  std::unique_ptr<ModelRows> tree_rows(int64_t count, Shapes shapes) override {
    if (!tree_ && !source_tree_) return Model::tree_rows(count, shapes);
    require(tree_ || count == 1, "model {}: an encoder-decoder module's tree calls hold one row, not {}", source_,
            count);
    start_rows(count);
    TreeCalls calls;
    calls.masked = [this](const at::Tensor& ids, const at::Tensor& rows, const at::Tensor& positions,
                          const at::Tensor& slots, const at::Tensor& mask) {
      return checked_logits(module_.get_method("extend_rows_masked")({ids, rows, positions, slots, mask}),
                            ids.size(0), ids.size(1), vocab_size_, source_, "extend_rows_masked");
    };
    calls.copy = [this](const at::Tensor& rows, const at::Tensor& sources, const at::Tensor& targets) {
      module_.get_method("copy_slots")({rows, sources, targets});
    };
    if (source_tree_) calls.encode = [this](const at::Tensor& source) { encode(source); };
    return native_rows(rows_call(), count, *max_length_, device_, source_, shapes,
                       shapes == Shapes::graphed ? &graphed_ : &fixed_, std::move(calls), fresh_lengths());
  }

  std::string features_obstacle() const override {
    if (features_) return "";
    if (encoder_decoder_) return "an encoder-decoder module (T5): feature drafts draft decoder-only targets";
    return "the module has no record_features / features / feature_weights methods, or not the batched form they "
           "need (model.h); re-export it with this version of speculant.export, which writes them";
  }
  int64_t record_features(const std::optional<std::vector<int64_t>>& layers) override {
    if (!features_) Model::record_features(layers);
    c10::IValue list = layers ? c10::IValue(c10::List<int64_t>(*layers)) : c10::IValue();
    const int64_t width = module_.get_method("record_features")({list}).toInt();
    fixed_.clear();  // what was captured records nothing
    graphed_.clear();
    return width;
  }
  at::Tensor features(int64_t row) override {
    if (!features_) fail("model {}: {}", source_, features_obstacle());
    if (!row_lengths_) {
      require(row == 0, "model {}: row {} of a batch of 1", source_, row);
      return module_.get_method("features")({int64_t{-1}, length_}).toTensor();
    }
    require(row >= 0 && row < static_cast<int64_t>(row_lengths_->size()), "model {}: row {} of a batch of {}",
            source_, row, row_lengths_->size());
    return module_.get_method("features")({row, (*row_lengths_)[row]}).toTensor();
  }
  std::vector<at::Tensor> feature_weights() override {
    if (!features_) Model::feature_weights();
    auto both = module_.get_method("feature_weights")({}).toTuple();
    return {both->elements().at(0).toTensor(), both->elements().at(1).toTensor()};
  }
  std::string fixed_shapes_obstacle() const override {
    if (batched_) return "";
    if (encoder_decoder_) return "an encoder-decoder module (T5) has no batched extend_rows call to run them on";
    if (!max_length_) return "the module has no max_length attribute (every fixed-shape call reads all its slots)";
    return "the module has no start_rows / extend_rows methods (model.h) to run them on; speculant.export "
           "writes them";
  }
  std::string graph_failure() const override { return graphed_.failure(); }
  int64_t graphs_captured() const override { return graphed_.captured(); }

  void encode(const at::Tensor& source) override {
    module_.get_method("encode")({as_batch(source)});
    length_ = 0;
  }

  void reset(const at::Tensor& tokens) override {
    if (tokens.numel() == 0) {
      truncate(0);
      return;
    }
    checked_logits(module_.get_method("prefill")({as_batch(tokens)}), tokens.numel(), vocab_size_, source_,
                   "prefill");
    length_ = tokens.numel();
  }
  at::Tensor extend(const at::Tensor& tokens) override {
    at::Tensor logits = checked_logits(module_.get_method("extend")({as_batch(tokens)}), tokens.numel(),
                                       vocab_size_, source_, "extend");
    length_ += tokens.numel();
    return logits;
  }
  void truncate(int64_t length) override {
    module_.get_method("truncate")({length});
    length_ = length;
  }
  int64_t length() const override { return length_; }
  std::string form() const override { return "cached"; }
  // The module's state (its cache) is its own: a deep copy, weights included.
  std::shared_ptr<Model> replica() override {
    return std::make_shared<CachedScriptModel>(module_.deepcopy(), source_, metadata_);
  }

  // The module's own count, to check the contract in the probe.
  int64_t module_length() { return module_.get_method("cache_length")({}).toInt(); }

 private:
  // A row cache of `count` rows (the module's start_rows), kept while the count stays.
  void start_rows(int64_t count) {
    if (rows_started_ == count) return;
    module_.get_method("start_rows")({count});
    rows_started_ = count;
    fixed_.clear();  // what the graphs wrote into is gone
    graphed_.clear();
  }
  // The lengths of the rows made now, which features() reads while they live.
  std::shared_ptr<std::vector<int64_t>> fresh_lengths() {
    row_lengths_ = std::make_shared<std::vector<int64_t>>();
    return row_lengths_;
  }
  RowsCall rows_call() {
    return [this](const at::Tensor& ids, const at::Tensor& rows, const at::Tensor& positions, const at::Tensor& slots,
                  int64_t keys) {
      return checked_logits(module_.get_method("extend_rows")({ids, rows, positions, slots, keys}), ids.size(0),
                            ids.size(1), vocab_size_, source_, "extend_rows");
    };
  }

  torch::jit::Module module_;
  std::string source_;
  int64_t length_ = 0;
  bool batched_ = false;
  bool tree_ = false;  // extend_rows_masked and copy_slots too
  bool source_tree_ = false;  // an encoder-decoder module's tree calls of one row (beam search)
  int64_t rows_started_ = 0;  // the row cache's batch size (0: none yet)
  bool features_ = false;  // record_features, features and feature_weights
  std::shared_ptr<std::vector<int64_t>> row_lengths_;  // the latest batch's rows' lengths (null: batch 1)
  // The fixed-shape calls' buffers, without and with CUDA graphs; what they must not move: every tensor the
  // module holds (its cache among them).
  GraphCache::State state_ = [this] {
    std::vector<std::pair<std::string, const void*>> out;
    for (const auto& attribute : module_.named_attributes(/*recurse=*/true)) {
      if (attribute.value.isTensor()) {
        out.emplace_back(fmt::format("the module's tensor `{}` (model {})", attribute.name, source_),
                         attribute.value.toTensor().data_ptr());
      }
    }
    return out;
  };
  GraphCache fixed_{false, state_}, graphed_{true, state_};
};

class PlainScriptModel final : public Model {
 public:
  PlainScriptModel(torch::jit::Module module, std::string source, std::string metadata)
      : module_(std::move(module)), source_(std::move(source)) {
    metadata_ = std::move(metadata);
    device_ = module_device(module_);
    max_length_ = int_attribute(module_, "max_length", source_);
    if (max_length_ && *max_length_ <= 0) max_length_.reset();
    auto vocab = int_attribute(module_, "vocab_size", source_);
    if (vocab) {
      require(*vocab > 0, "model {}: vocab_size must be positive, got {}", source_, *vocab);
      vocab_size_ = *vocab;
    } else {  // probe: the output's last dimension
      c10::IValue out = module_.forward({at::zeros({1, 1}, at::TensorOptions(device_).dtype(at::kLong))});
      require(out.isTensor() && out.toTensor().dim() == 3,
              "model {}: forward(input_ids[1, T]) must return logits [1, T, V]", source_);
      vocab_size_ = out.toTensor().size(2);
    }
    history_ = at::empty({0}, at::TensorOptions(device_).dtype(at::kLong));
  }

  void reset(const at::Tensor& tokens) override { history_ = tokens.clone(); }
  at::Tensor extend(const at::Tensor& tokens) override {
    history_ = at::cat({history_, tokens});  // [L + k]
    at::Tensor all = checked_logits(module_.forward({as_batch(history_)}), history_.numel(), vocab_size_,
                                    source_, "forward");
    return all.narrow(0, history_.numel() - tokens.numel(), tokens.numel());  // [k, V]
  }
  void truncate(int64_t length) override { history_ = history_.narrow(0, 0, length); }
  int64_t length() const override { return history_.numel(); }
  std::string form() const override { return "plain"; }
  std::string fixed_shapes_obstacle() const override {
    return "the plain form recomputes the whole sequence at every call, so its shapes grow with it; export the "
           "model with speculant.export for the cached form";
  }
  // forward is stateless (the history is kept here): replicas share the module.
  std::shared_ptr<Model> replica() override {
    return std::make_shared<PlainScriptModel>(module_, source_, metadata_);
  }

 private:
  torch::jit::Module module_;
  std::string source_;
  at::Tensor history_;  // [L] the tokens "cached" so far
};

// Runs a one-token probe through the chosen backend so that a broken file fails at load, with the reason.
void probe(Model& model, const std::string& source) {
  at::Tensor one = at::zeros({1}, at::TensorOptions(model.device()).dtype(at::kLong));
  if (model.encoder_decoder()) model.encode(one);
  model.reset(one);
  model.extend(one);  // [1, V]; the backend checks the shape
  require(model.length() == 2, "model {}: cache length after prefill(1 token) + extend(1 token) must be 2",
          source);
  if (auto* cached = dynamic_cast<CachedScriptModel*>(&model)) {
    require(cached->module_length() == 2,
            "model {}: cache_length() must return 2 after prefill of 1 token and extend of 1, got {}", source,
            cached->module_length());
    cached->truncate(1);
    require(cached->module_length() == 1, "model {}: cache_length() must return 1 after truncate(1), got {}",
            source, cached->module_length());
  }
  model.truncate(0);
}

std::shared_ptr<Model> from_module(torch::jit::Module module, const std::string& source, std::string metadata) {
  c10::InferenceMode inference_mode;  // the probes are model calls too: no autograd graph
  module.eval();
  const char* cached_methods[] = {"prefill", "extend", "truncate", "cache_length"};
  std::vector<std::string> present, missing;
  for (const char* name : cached_methods) (has_method(module, name) ? present : missing).push_back(name);
  std::shared_ptr<Model> model;
  if (missing.empty()) {
    model = std::make_shared<CachedScriptModel>(std::move(module), source, std::move(metadata));
  } else if (has_method(module, "encode")) {
    fail("model {}: has encode() (an encoder-decoder) but is missing {} of the cached form (prefill, extend, "
         "truncate, cache_length), which encoder-decoder models need",
         source, fmt::join(missing, ", "));
  } else if (present.empty() && has_method(module, "forward")) {
    model = std::make_shared<PlainScriptModel>(std::move(module), source, std::move(metadata));
  } else if (present.empty()) {
    fail("model {}: follows neither form of the contract: the cached form needs methods prefill, extend, "
         "truncate and cache_length; the plain form needs forward(input_ids[1, T]) -> logits[1, T, V]",
         source);
  } else {
    fail("model {}: has {} but is missing {} of the cached form (prefill, extend, truncate, cache_length)",
         source, fmt::join(present, ", "), fmt::join(missing, ", "));
  }
  try {
    probe(*model, source);
  } catch (const ValueError&) {
    throw;
  } catch (const c10::Error& e) {
    fail("model {}: failed the one-token probe of the {} contract: {}", source, model->form(),
         e.what_without_backtrace());
  }
  return model;
}

constexpr const char* kMetadataFile = "speculant.json";

torch::jit::Module script_load(const std::function<torch::jit::Module(torch::jit::ExtraFilesMap&)>& loader,
                               const std::string& source, std::string& metadata) {
  torch::jit::ExtraFilesMap extra{{kMetadataFile, ""}};
  try {
    torch::jit::Module module = loader(extra);
    metadata = extra[kMetadataFile];
    return module;
  } catch (const c10::Error& e) {
    fail("model {}: is not a loadable TorchScript file: {}", source, e.what_without_backtrace());
  }
}

}  // namespace

std::shared_ptr<Model> load_script_file(const std::string& path, std::optional<at::Device> device) {
  std::string metadata;
  torch::jit::Module module = script_load(
      [&](torch::jit::ExtraFilesMap& extra) { return torch::jit::load(path, device, extra); }, path, metadata);
  return from_module(std::move(module), path, std::move(metadata));
}

std::shared_ptr<Model> load_script_bytes(const std::string& bytes, const std::string& source,
                                         std::optional<at::Device> device) {
  std::string metadata;
  torch::jit::Module module = script_load(
      [&](torch::jit::ExtraFilesMap& extra) {
        std::istringstream stream(bytes);
        return torch::jit::load(stream, device, extra);
      },
      source, metadata);
  return from_module(std::move(module), source, std::move(metadata));
}

}  // namespace speculant
