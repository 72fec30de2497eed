#include "loop/decoder.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "errors.h"
#include "device/graphs.h"
#include "drafting/hierarchy.h"
#include "device/verification_graphs.h"

namespace speculant {
namespace {

void check_ids(const std::vector<int64_t>& ids, const char* name, int64_t vocab) {
  require(!ids.empty(), "{} must hold at least one token id, got an empty sequence", name);
  for (size_t i = 0; i < ids.size(); ++i) {
    require(ids[i] >= 0 && ids[i] < vocab, "{}[{}] = {} is outside the vocabulary [0, {})", name, i, ids[i],
            vocab);
  }
}

void check_source_length(std::optional<int64_t> limit, const char* role, const std::string& name,
                         int64_t length) {
  if (limit) {
    require(length <= *limit, "{} model encodes at most max_source_length = {} tokens, {} has {}", role, *limit,
            name, length);
  }
}

void check_length(std::optional<int64_t> limit, const char* role, const std::string& name, int64_t needed) {
  if (limit) {
    require(needed <= *limit,
            "{} model holds at most max_length = {} positions, but {} plus max_new_tokens needs {} "
            "(prompt + max_new_tokens - 1)",
            role, *limit, name, needed);
  }
}

// Fixed shapes need a backend that has them; graphs, a CUDA model and a build with CUDA graphs.
void check_shapes(const Model* model, Shapes shapes, const char* role) {
  if (shapes == Shapes::dynamic) return;
  const std::string why = model->fixed_shapes_obstacle();
  require(why.empty(), "the {} ({} form) has no fixed-shape calls, so no CUDA graphs: {}", role, model->form(), why);
  if (shapes != Shapes::graphed) return;
  const std::string capture = model->capture_obstacle();
  require(capture.empty(), "the {} ({} form) cannot be captured into CUDA graphs: {}", role, model->form(), capture);
  require(model->device().is_cuda(), "CUDA graphs need a CUDA model; the {} is on {}", role,
          model->device().str());
  const std::string build = graphs_obstacle();
  require(build.empty(), "CUDA graphs of the {}: {}", role, build);
}

}  // namespace

Decoder::Decoder(std::shared_ptr<Model> target, std::shared_ptr<Drafter> draft, int64_t gamma,
                 SamplingConfig config, Shapes target_shapes, Shapes draft_shapes, std::vector<int64_t> tree,
                 Siblings siblings, std::optional<TreeGrowth> growth)
    : target_(std::move(target)), draft_(std::move(draft)), gamma_(gamma), config_(config),
      target_shapes_(target_shapes), draft_shapes_(draft_shapes), siblings_(siblings) {
  require(target_ != nullptr, "target must be a model");
  config_.validate();
  check_shapes(target_.get(), target_shapes_, "target");
  if (target_shapes_ != Shapes::dynamic && !growth) {  // a grown tree's shapes vary without bound: not keyed
    verify_graphs_ = std::make_shared<VerificationGraphs>(target_shapes_ == Shapes::graphed);
  }
  if (draft_ && draft_->model()) check_shapes(draft_->model(), draft_shapes_, "draft");
  if (!draft_) {
    require(gamma_ == 0, "gamma must be 0 without a draft model, got {}", gamma_);
    return;
  }
  require(gamma_ >= 1, "gamma must be an integer >= 1 (the number of draft tokens per iteration), got {}",
          gamma_);
  const std::vector<std::mutex*> draft_mutexes = draft_->locks();
  require(std::find(draft_mutexes.begin(), draft_mutexes.end(), &target_->in_use()) == draft_mutexes.end(),
          "draft and target must be different model handles (each owns its cache); load the file twice to draft "
          "with the target itself");
  require(draft_->vocab_size() == target_->vocab_size(),
          "target and draft vocabularies differ: target vocab_size = {}, draft vocab_size = {}. Both models' "
          "logits must index one vocabulary, the same token ids. Models that share a tokenizer often pad their "
          "LM heads differently beyond it (to a multiple of 64 or 128): load the smaller one as a transformers "
          "model or save_pretrained directory with speculant.load(model_or_dir, vocab_size=<the larger size>), "
          "which gives its padded ids -inf logits (probability 0), so the output law stays exactly the "
          "target's. vocab_size= pads live models only: an exported file (.pt, .pt2) keeps the vocabulary it "
          "was exported with, so load that model from transformers (the object or its save_pretrained "
          "directory) instead of its file. A drafter from speculant.drafters takes the target's vocab_size when "
          "built. A draft with another tokenizer: SpeculativeDecoder(..., draft_tokenizer=, target_tokenizer=) "
          "drafts through text",
          target_->vocab_size(), draft_->vocab_size());
  require(draft_->model() == nullptr || draft_->encoder_decoder() == target_->encoder_decoder(),
          "target and draft must both be encoder-decoder models or both decoder-only: the target is {}, the "
          "draft is {}", target_->encoder_decoder() ? "encoder-decoder" : "decoder-only",
          draft_->encoder_decoder() ? "encoder-decoder" : "decoder-only");
  require(draft_->device() == target_->device(), "target and draft must be on the same device: target on {}, "
          "draft on {}", target_->device().str(), draft_->device().str());
  if (tree.empty() && !growth) return;
  require(tree.empty() || !growth, "tree: give a shape or a grown tree, not both");
  std::optional<Tree> given;  // breadth-first parents [-1, ...] (tree.h), e.g. speculant.analysis.best_tree's
  if (!tree.empty() && tree.front() == -1) {
    given.emplace(tree);
    require(given->size() >= 2 && given->size() <= 4097, "tree: parents must give 1 to 4096 drafts, got {}",
            given->size() - 1);
  }
  const auto depth = growth ? growth->depth : given ? given->depth() : static_cast<int64_t>(tree.size());
  require(depth == gamma_, "gamma must be the tree's depth {}, got {}", depth, gamma_);
  require(config_.lenience == 1.0, "lenience must be 1 with tree= (A.5's bound is proven for one draft per "
          "position, not for trees), got {}", config_.lenience);
  const std::string target_why = target_->tree_obstacle(), draft_why = draft_->tree_obstacle();
  require(draft_why.empty(), "tree=: the draft cannot propose trees: {}", draft_why);
  require(target_why.empty(), "tree=: the target ({} form) cannot verify a tree in one call: {}", target_->form(),
          target_why);
  TreePlan plan;
  if (growth) {
    require(growth->budget >= 1 && growth->budget <= 4096 && growth->depth >= 1 && growth->children >= 1 &&
                growth->width >= 1,
            "a grown tree needs 1 <= budget <= 4096 and depth, children, width >= 1; got budget {}, depth {}, "
            "children {}, width {}", growth->budget, growth->depth, growth->children, growth->width);
    plan.growth = growth;
    tree.assign(growth->depth, growth->children);  // the ranks any depth may hold
  } else if (given) {
    // by depth d: the nodes no deeper than d, a prefix in breadth-first order; the ranks: each depth's most children
    std::vector<int64_t> ranks(depth, 0);
    for (int64_t node = 0; node < given->size(); ++node) {
      int64_t& most = ranks[given->depth(node)];
      if (given->children(node) > most) most = given->children(node);
    }
    for (int64_t d = 0, end = 1; d <= depth; ++d) {
      while (end < given->size() && given->depth(end) <= d) ++end;
      plan.by_depth.emplace_back(std::vector<int64_t>(tree.begin(), tree.begin() + end));
    }
    tree = std::move(ranks);
  } else {
    for (size_t d = 0; d <= tree.size(); ++d) {
      plan.by_depth.push_back(Tree::from_shape(std::vector<int64_t>(tree.begin(), tree.begin() + d)));
    }
  }
  trees_ = std::move(plan);
  tree_shape_ = std::move(tree);
}

namespace {

// A row's name in messages: "prompt_ids" alone, "prompt_ids[2]" in a batch.
std::string row_name(const char* name, size_t row, size_t rows) {
  return rows == 1 ? std::string(name) : fmt::format("{}[{}]", name, row);
}

}  // namespace

// Locks every mutex, none while blocking on another (std::lock's scheme for a list: block on one, try the
// rest; on a busy one release all and start again from it).
std::vector<std::unique_lock<std::mutex>> lock_all(std::vector<std::mutex*> mutexes) {
  std::sort(mutexes.begin(), mutexes.end());  // one lock per mutex, however often it is listed
  mutexes.erase(std::unique(mutexes.begin(), mutexes.end()), mutexes.end());
  size_t first = 0;
  for (;;) {
    std::vector<std::unique_lock<std::mutex>> held;
    held.emplace_back(*mutexes[first]);
    size_t busy = mutexes.size();
    for (size_t i = 0; i < mutexes.size() && busy == mutexes.size(); ++i) {
      if (i == first) continue;
      std::unique_lock<std::mutex> lock(*mutexes[i], std::try_to_lock);
      if (lock.owns_lock()) {
        held.push_back(std::move(lock));
      } else {
        busy = i;
      }
    }
    if (busy == mutexes.size()) return held;
    first = busy;  // `held` unlocks here
    std::this_thread::yield();
  }
}

std::vector<Generation> Decoder::generate_batch(const std::vector<std::vector<int64_t>>& prompts,
                                                const std::vector<std::vector<int64_t>>& sources,
                                                int64_t max_new_tokens, const std::vector<int64_t>& eos_token_ids,
                                                std::optional<uint64_t> seed, bool profile,
                                                const GammaSchedule& schedule) const {
  if (busy_->exchange(true)) {
    throw std::runtime_error("this decoder is already generating in another thread; a decoder runs one "
                             "generation at a time: create one decoder per thread (decoders may share models)");
  }
  struct Release {
    std::atomic<bool>& flag;
    ~Release() { flag = false; }
  } release{*busy_};
  check_inputs(prompts, sources, max_new_tokens, eos_token_ids);
  require(!trees_ || schedule.policy == "fixed", "gamma_policy must be \"fixed\" with tree= (the tree's "
          "shape is the draft's), got \"{}\"", schedule.policy);
  const size_t count = prompts.size();

  std::vector<Row> rows;
  const at::Device device = target_->device();
  for (size_t r = 0; r < count; ++r) {
    const uint64_t row_seed =
        seed ? *seed + r : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
    rows.push_back(make_row(draft_ != nullptr, gamma_, schedule, max_new_tokens - 1, tree_shape_, device, row_seed));
    rows.back().stop_at = max_new_tokens;
    rows.back().running = max_new_tokens > 0;
  }

  // No model call records an autograd graph, whatever its parameters' requires_grad (Python callbacks of
  // live models run on this thread and see the same mode).
  c10::InferenceMode inference_mode;

  // One generation at a time per model and drafter: each owns mutable state (its replicas included). A
  // hierarchical draft holds several models: all are taken at once, never one while waiting for another.
  std::vector<std::mutex*> mutexes{&target_->in_use()};
  if (draft_) {
    const std::vector<std::mutex*> draft_mutexes = draft_->locks();
    mutexes.insert(mutexes.end(), draft_mutexes.begin(), draft_mutexes.end());
  }
  const std::vector<std::unique_lock<std::mutex>> locks = lock_all(mutexes);

  const bool trees = trees_.has_value();
  Batch::Setup setup{*target_, draft_.get(), config_, eos_token_ids, profile, trees ? &*trees_ : nullptr, siblings_};
  setup.verify_graphs = verify_graphs_.get();
  const auto rows_count = static_cast<int64_t>(count);
  std::unique_ptr<ModelRows> target_rows =
      trees ? target_->tree_rows(rows_count, target_shapes_) : target_->rows(rows_count, target_shapes_);
  std::unique_ptr<DraftRows> draft_rows;
  if (draft_) {
    draft_rows = draft_->rows(rows_count, draft_shapes_, trees);
  }
  Batch batch(std::move(setup), rows, std::move(target_rows), std::move(draft_rows));
  batch.start(prompts);
  if (max_new_tokens > 0) batch.prefill(prompts, sources);
  while (batch.running()) batch.iterate();  // Algorithm 1, each phase for every running row
  batch.finish();
  std::vector<Generation> out;
  out.reserve(count);
  for (Row& row : rows) out.push_back(std::move(row.out));
  return out;
}

std::shared_ptr<Drafter> Decoder::as_draft(const GammaSchedule& schedule) const {
  require(draft_ != nullptr, "a decoder without a draft (plain decoding) cannot be a draft level: use its model "
                             "as the draft");
  require(!trees_, "a decoder with tree= cannot be a draft level: a level below the top drafts chains "
                          "(its output must be one sequence)");
  require(config_.lenience == 1.0, "a draft level must be exact (lenience 1), so that its output law is its "
          "model's own and the q it reports is the law its tokens were drawn from; got lenience {}",
          config_.lenience);
  return hierarchy_drafter(target_, draft_, gamma_, schedule, draft_shapes_);
}

void Decoder::check_inputs(const std::vector<std::vector<int64_t>>& prompts,
                           const std::vector<std::vector<int64_t>>& sources, int64_t max_new_tokens,
                           const std::vector<int64_t>& eos_token_ids) const {
  const size_t count = prompts.size();
  require(count >= 1, "prompt_ids must hold at least one prompt, got an empty batch");
  const int64_t vocab = target_->vocab_size();
  for (size_t r = 0; r < count; ++r) check_ids(prompts[r], row_name("prompt_ids", r, count).c_str(), vocab);
  if (!target_->encoder_decoder()) {
    require(sources.empty(), "encoder_input_ids is only for encoder-decoder models; the target is a "
                             "decoder-only model (prompt_ids holds its whole context)");
  } else {
    require(!sources.empty(), "the target is an encoder-decoder model: pass encoder_input_ids (the source "
                              "sequence) as well as prompt_ids (the decoder's start)");
    require(sources.size() == count, "encoder_input_ids holds {} sources for {} prompts: pass one source per "
            "prompt", sources.size(), count);
    for (size_t r = 0; r < count; ++r) {
      const std::string name = row_name("encoder_input_ids", r, count);
      check_ids(sources[r], name.c_str(), vocab);
      const auto length = static_cast<int64_t>(sources[r].size());
      check_source_length(target_->max_source_length(), "target", name, length);
      if (draft_) check_source_length(draft_->max_source_length(), "draft", name, length);
    }
  }
  require(max_new_tokens >= 0, "max_new_tokens must be >= 0, got {}", max_new_tokens);
  for (const int64_t eos : eos_token_ids) {
    require(eos >= 0 && eos < vocab, "eos_token_id {} is outside the vocabulary [0, {})", eos, vocab);
  }
  for (size_t r = 0; r < count; ++r) {
    const int64_t needed = static_cast<int64_t>(prompts[r].size()) + max_new_tokens - 1;
    const std::string name = row_name("prompt_ids", r, count);
    check_length(target_->max_length(), "target", name, needed);
    if (draft_) check_length(draft_->max_length(), "draft", name, needed);
  }
}

}  // namespace speculant
