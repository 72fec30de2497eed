// TorchScript backends of Model: the cached form calls the module's own cache methods, the plain form keeps
// the token history and recomputes it.
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <functional>
#include <sstream>

#include "errors.h"
#include "model.h"

namespace speculant {
namespace {

at::Tensor as_batch(const at::Tensor& tokens) { return tokens.view({1, tokens.numel()}); }  // [1, k]

// logits returned by the module for k input tokens -> [k, V], checked against the contract.
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

// A batch run natively by a cached module with start_rows / extend_rows (export/cached.py): one call per step
// for every row taking part, tokens right-padded to the longest row's count. Each row's length is kept here;
// a padding token is written to the scratch slot max_length, so no row's cache is touched beyond its tokens.
class ScriptRows final : public ModelRows {
 public:
  ScriptRows(torch::jit::Module module, int64_t count, int64_t vocab, int64_t max_length, at::Device device,
             std::string source)
      : module_(std::move(module)), lengths_(count, 0), vocab_(vocab), max_length_(max_length), device_(device),
        source_(std::move(source)) {
    module_.get_method("start_rows")({count});
  }

  int64_t count() const override { return static_cast<int64_t>(lengths_.size()); }
  void encode(const std::vector<at::Tensor>&) override {
    fail("model {}: batched calls of an encoder-decoder module are not supported", source_);
  }
  void reset(const std::vector<at::Tensor>& tokens) override {
    std::fill(lengths_.begin(), lengths_.end(), 0);
    std::vector<at::Tensor> some(tokens.size());
    for (size_t r = 0; r < tokens.size(); ++r) some[r] = tokens[r].numel() > 0 ? tokens[r] : at::Tensor();
    extend(some);
  }
  std::vector<at::Tensor> extend(const std::vector<at::Tensor>& tokens) override {
    std::vector<int64_t> rows;
    int64_t width = 0, keys = 0;
    for (size_t r = 0; r < tokens.size(); ++r) {
      if (!tokens[r].defined()) continue;
      rows.push_back(static_cast<int64_t>(r));
      const int64_t k = tokens[r].numel(), end = lengths_[r] + k;
      require(end <= max_length_, "model {}: row {} holds {} cached + {} new positions, more than max_length = {}",
              source_, r, lengths_[r], k, max_length_);
      width = std::max(width, k);
      keys = std::max(keys, end);
    }
    std::vector<at::Tensor> out(tokens.size());
    if (rows.empty()) return out;
    const auto count = static_cast<int64_t>(rows.size());
    at::Tensor positions = at::empty({count, width}, at::kLong), slots = at::empty({count, width}, at::kLong);
    int64_t* position = positions.data_ptr<int64_t>();
    int64_t* slot = slots.data_ptr<int64_t>();
    std::vector<at::Tensor> ids(count);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = rows[i], k = tokens[r].numel();
      for (int64_t j = 0; j < width; ++j) {
        position[i * width + j] = std::min(lengths_[r] + j, max_length_ - 1);  // padding: any existing position
        slot[i * width + j] = j < k ? lengths_[r] + j : max_length_;         // padding: the scratch slot
      }
      ids[i] = k < width ? at::constant_pad_nd(tokens[r], {0, width - k}, 0) : tokens[r];
    }
    const auto on_device = [this](const at::Tensor& host) { return host.to(device_); };
    c10::IValue result = module_.get_method("extend_rows")(
        {at::stack(ids), on_device(at::tensor(rows, at::kLong)), on_device(positions), on_device(slots), keys});
    const at::Tensor logits = checked_logits(result, count, width, vocab_, source_, "extend_rows");  // [R, W, V]
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = rows[i], k = tokens[r].numel();
      out[r] = logits[i].narrow(0, 0, k);  // [k, V]
      lengths_[r] += k;
    }
    return out;
  }
  void truncate(int64_t row, int64_t length) override { lengths_[row] = length; }
  int64_t length(int64_t row) const override { return lengths_[row]; }

 private:
  torch::jit::Module module_;
  std::vector<int64_t> lengths_;
  int64_t vocab_, max_length_;
  at::Device device_;
  std::string source_;
};

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
  }

  bool batched() const override { return batched_; }
  std::unique_ptr<ModelRows> rows(int64_t count) override {
    if (!batched_ || count == 1) return Model::rows(count);
    return std::make_unique<ScriptRows>(module_, count, vocab_size_, *max_length_, device_, source_);
  }

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
  torch::jit::Module module_;
  std::string source_;
  int64_t length_ = 0;
  bool batched_ = false;
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
