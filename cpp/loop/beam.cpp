#include "loop/beam.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <unordered_map>
#include <utility>

#include "loop/decoder.h"
#include "errors.h"
#include "loop/interrupt.h"
#include "device/upload.h"

namespace speculant {
namespace {

constexpr double kPush = -1.0e9;  // transformers' push below every real score

// Every sequence a search has met, as a tree: node n is token[n] after node parent[n]'s sequence. Node 0 is
// the prompt's last token (depth 0); a node of depth d is a beam's d-th new token.
class Nodes {
 public:
  explicit Nodes(int64_t root_token) { add(-1, root_token); }
  // The child (parent, token), made if new.
  int64_t child(int64_t parent, int64_t token) {
    auto [it, made] = children_.try_emplace({parent, token}, size());
    if (made) add(parent, token);
    return it->second;
  }
  int64_t size() const { return static_cast<int64_t>(token_.size()); }
  int64_t token(int64_t node) const { return token_[node]; }
  int64_t parent(int64_t node) const { return parent_[node]; }
  int64_t depth(int64_t node) const { return depth_[node]; }
  // Forgets the children of nodes outside `keep` (a flag per node), so that a dropped sequence met again is a
  // new node: no cache holds it any more.
  void forget_outside(const std::vector<char>& keep) {
    for (auto it = children_.begin(); it != children_.end();) {
      it = keep[it->second] ? std::next(it) : children_.erase(it);
    }
  }

 private:
  void add(int64_t parent, int64_t token) {
    token_.push_back(token);
    parent_.push_back(parent);
    depth_.push_back(parent < 0 ? 0 : depth_[parent] + 1);
  }
  std::vector<int64_t> token_, parent_, depth_;
  std::map<std::pair<int64_t, int64_t>, int64_t> children_;
};

// One model's cache of nodes: its row 0 holds the prompt but its last token, committed, and the nodes it ran,
// as tentative tree nodes (each attending to its ancestors), with their logits.
class NodeCache {
 public:
  NodeCache(Model& model, const char* role, const std::vector<int64_t>& prompt, const at::Tensor& source)
      : model_(model), role_(role), rows_(model.tree_rows(1)) {
    if (source.defined()) rows_->encode({source.to(model.device())});
    const auto head = static_cast<int64_t>(prompt.size()) - 1;
    rows_->reset({at::tensor(std::vector<int64_t>(prompt.begin(), prompt.begin() + head), at::kLong)
                      .to(model.device())});
  }
  bool has(int64_t node) const { return index_.count(node) > 0; }
  const at::Tensor& logits(int64_t node) const { return logits_.at(node); }
  // The nodes of `wanted` this cache lacks, with their uncached ancestors, parents first.
  std::vector<int64_t> missing(const std::vector<int64_t>& wanted, const Nodes& nodes) const {
    std::vector<int64_t> out;
    for (int64_t node : wanted) {
      for (int64_t up = node; up >= 0 && !has(up); up = nodes.parent(up)) {
        if (std::find(out.begin(), out.end(), up) == out.end()) out.push_back(up);
      }
    }
    std::stable_sort(out.begin(), out.end(), [&](int64_t a, int64_t b) { return nodes.depth(a) < nodes.depth(b); });
    return out;
  }
  // Runs `run` (each node's parent cached or earlier in the list) in one call, keeping their logits.
  void run(const std::vector<int64_t>& run, const Nodes& nodes) {
    if (run.empty()) return;
    check_interrupt();
    ModelRows::TreeNodes tree;
    std::vector<int64_t> tokens;
    for (size_t j = 0; j < run.size(); ++j) {
      const int64_t node = run[j], parent = nodes.parent(node);
      tokens.push_back(nodes.token(node));
      tree.offsets.push_back(nodes.depth(node));
      tree.parents.push_back(parent < 0 ? -1 : index_.at(parent));
      index_[node] = static_cast<int64_t>(entries_.size());
      entries_.push_back(node);
    }
    const at::Tensor logits =
        rows_->extend_tree({upload(tokens, model_.device())}, {tree})[0];
    require(at::isfinite(logits).all().item<bool>(), "the {} model's logits hold NaN or infinity: beam search "
            "cannot rank its continuations", role_);
    for (size_t j = 0; j < run.size(); ++j) logits_[run[j]] = logits[static_cast<int64_t>(j)];
    calls += 1;
    tokens_run += static_cast<int64_t>(run.size());
  }
  // Keeps the nodes flagged in `keep` (closed under parents), dropping the others' cache entries and logits.
  void prune(const std::vector<char>& keep) {
    std::vector<int64_t> kept_entries, kept_nodes;
    for (size_t e = 0; e < entries_.size(); ++e) {
      const int64_t node = entries_[e];
      if (keep[node]) {
        kept_entries.push_back(static_cast<int64_t>(e));
        kept_nodes.push_back(node);
      } else {
        logits_.erase(node);
      }
    }
    if (kept_nodes.size() == entries_.size()) return;
    rows_->prune(0, kept_entries);
    entries_ = std::move(kept_nodes);
    index_.clear();
    for (size_t e = 0; e < entries_.size(); ++e) index_[entries_[e]] = static_cast<int64_t>(e);
  }
  int64_t calls = 0, tokens_run = 0;

 private:
  Model& model_;
  const char* role_;
  std::unique_ptr<ModelRows> rows_;
  std::vector<int64_t> entries_;               // tentative entry -> node
  std::unordered_map<int64_t, int64_t> index_;  // node -> tentative entry
  std::unordered_map<int64_t, at::Tensor> logits_;
};

// transformers' beam search state for one prompt (batch size 1), advanced one step at a time.
class Search {
 public:
  struct Next {
    int64_t beam, token;  // the running beam it extends, and its token
  };

  Search(const BeamConfig& config, int64_t prompt_length, int64_t vocab, at::Device device)
      : config_(config), w_(config.beams), vocab_(vocab), prompt_length_(prompt_length),
        max_length_(prompt_length + config.max_new_tokens), length_(prompt_length), device_(device),
        keep_(std::max<int64_t>(2, 1 + static_cast<int64_t>(config.eos_token_ids.size())) * config.beams),
        running_(config.beams), finished_(config.beams) {
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    running_scores_ = at::zeros({1, w_}, f32);
    running_scores_.narrow(1, 1, w_ - 1).fill_(kPush);
    finished_scores_ = at::full({1, w_}, kPush, f32);
    finished_flags_ = at::zeros({1, w_}, f32.dtype(at::kBool));
  }

  bool done() const { return done_; }
  int64_t steps_left() const { return max_length_ - length_; }
  const at::Tensor& running_scores() const { return running_scores_; }  // float [1, w], best first

  // One step on the running beams' logits ([w, V], row i: running beam i's next token). Returns the new running
  // beams, each as the old beam it extends and its token.
  std::vector<Next> step(const at::Tensor& logits) {
    const at::Tensor log_probs = at::log_softmax(logits.to(at::kFloat), -1);                       // [w, V]
    const at::Tensor scores = (log_probs + running_scores_.view({w_, 1})).reshape({1, w_ * vocab_});
    const auto k = std::min(keep_, w_ * vocab_);
    auto [top_scores, top_indices] = at::topk(scores, k);  // [1, K]
    const at::Tensor host_indices = top_indices.to(at::kCPU);
    const int64_t* index = host_indices.data_ptr<int64_t>();
    std::vector<Next> candidates(k);
    at::Tensor hits = at::empty({1, k}, at::kBool), did = at::empty({1, k}, at::kBool);
    bool all_hit = true;
    for (int64_t c = 0; c < k; ++c) {
      candidates[c] = {index[c] / vocab_, index[c] % vocab_};
      const bool eos = std::find(config_.eos_token_ids.begin(), config_.eos_token_ids.end(), candidates[c].token) !=
                       config_.eos_token_ids.end();
      const bool hit = eos || length_ + 1 >= max_length_;
      hits.data_ptr<bool>()[c] = hit;
      did.data_ptr<bool>()[c] = hit && c < w_;  // only the top w may finish
      all_hit = all_hit && hit;
    }
    hits = hits.to(device_);
    did = did.to(device_);

    // The next running beams: the best w candidates, finished ones pushed down.
    const at::Tensor running = top_scores + hits.to(at::kFloat) * kPush;
    const at::Tensor next = std::get<1>(at::topk(running, w_));
    const at::Tensor host_next = next.to(at::kCPU);
    std::vector<Next> out(w_);
    std::vector<std::vector<int64_t>> sequences(w_);
    for (int64_t i = 0; i < w_; ++i) {
      out[i] = candidates[host_next.data_ptr<int64_t>()[i]];
      sequences[i] = extended(out[i]);
    }

    // The finished set: the best w of itself and the candidates that just finished, length-penalized.
    at::Tensor penalized = top_scores / std::pow(static_cast<double>(length_ + 1 - prompt_length_),
                                                 config_.length_penalty);
    const bool full = finished_flags_.all().item<bool>() && config_.early_stopping == EarlyStopping::at_num_beams;
    penalized += at::full({1, 1}, full ? 1.0 : 0.0, penalized.options()) * kPush;
    penalized += at::full({1, 1}, improvable_ ? 0.0 : 1.0, penalized.options()) * kPush;
    penalized += at::logical_not(did) * kPush;
    const at::Tensor merged = at::cat({finished_scores_, penalized}, 1);
    const at::Tensor order = std::get<1>(at::topk(merged, w_));
    const at::Tensor host_order = order.to(at::kCPU);
    std::vector<std::vector<int64_t>> finished(w_);
    for (int64_t i = 0; i < w_; ++i) {
      const int64_t from = host_order.data_ptr<int64_t>()[i];
      finished[i] = from < w_ ? finished_[from] : extended(candidates[from - w_]);
    }
    finished_scores_ = merged.gather(1, order);
    finished_flags_ = at::cat({finished_flags_, did}, 1).gather(1, order);
    finished_ = std::move(finished);
    running_scores_ = running.gather(1, next);
    running_ = std::move(sequences);
    length_ += 1;

    // Can a running beam still beat the worst finished one (transformers' heuristic, early_stopping-dependent)?
    const double best_length = config_.early_stopping == EarlyStopping::never && config_.length_penalty > 0.0
                                   ? static_cast<double>(max_length_ - prompt_length_)
                                   : static_cast<double>(length_ - prompt_length_);
    const at::Tensor best_possible = running_scores_.narrow(1, 0, 1) / std::pow(best_length, config_.length_penalty);
    const at::Tensor worst_finished =
        at::where(finished_flags_, std::get<0>(at::min(finished_scores_, 1, /*keepdim=*/true)), kPush);
    improvable_ = improvable_ && at::any(best_possible > worst_finished).item<bool>();
    const bool all_finished = finished_flags_.all().item<bool>();
    done_ = !improvable_ || (all_finished && config_.early_stopping == EarlyStopping::at_num_beams) || all_hit;
    return out;
  }

  // The best `count` finished sequences (new tokens) and their scores.
  void results(BeamSearch& out, int64_t count) const {
    const at::Tensor scores = finished_scores_.to(at::kCPU).to(at::kDouble);
    for (int64_t i = 0; i < count; ++i) {
      out.sequences.push_back(finished_[i]);
      out.scores.push_back(scores.data_ptr<double>()[i]);
    }
  }

 private:
  std::vector<int64_t> extended(const Next& next) const {
    std::vector<int64_t> sequence = running_[next.beam];
    sequence.push_back(next.token);
    return sequence;
  }

  const BeamConfig& config_;
  const int64_t w_, vocab_, prompt_length_, max_length_;
  int64_t length_;  // transformers' cur_len: the prompt and the tokens so far
  at::Device device_;
  const int64_t keep_;  // K candidates per step
  std::vector<std::vector<int64_t>> running_, finished_;  // new tokens of each running / finished beam
  at::Tensor running_scores_, finished_scores_, finished_flags_;
  bool improvable_ = true, done_ = false;
};

void check_config(const BeamConfig& config, const Model& target, const Model* draft, size_t prompt, size_t source) {
  require(prompt >= 1, "prompt_ids is empty: beam search needs at least one prompt token");
  require(!target.encoder_decoder() || source >= 1,
          "the target is an encoder-decoder model: pass encoder_input_ids (the source, at least one token)");
  require(target.encoder_decoder() || source == 0,
          "encoder_input_ids is only for encoder-decoder models; the target is decoder-only");
  if (auto longest = target.max_source_length(); longest && static_cast<int64_t>(source) > *longest) {
    fail("encoder_input_ids holds {} tokens, more than the target's max_source_length = {}", source, *longest);
  }
  require(config.beams >= 1, "num_beams must be >= 1, got {}", config.beams);
  require(config.draft_beams == 0 || config.draft_beams >= config.beams,
          "draft_beams must be >= num_beams = {} (A.4's u >= w), got {}", config.beams, config.draft_beams);
  require(config.gamma >= 0, "gamma must be >= 0, got {}", config.gamma);
  require(config.return_sequences >= 1 && config.return_sequences <= config.beams,
          "num_return_sequences must be in [1, num_beams = {}], got {}", config.beams, config.return_sequences);
  require(config.max_new_tokens >= 1, "max_new_tokens must be >= 1 for beam search, got {}", config.max_new_tokens);
  require(std::isfinite(config.length_penalty), "length_penalty must be finite, got {}", config.length_penalty);
  const std::string target_why = target.beam_obstacle();
  require(target_why.empty(), "beam search needs tree calls (every beam in one cache): the target ({} form): {}",
          target.form(), target_why);
  if (config.gamma == 0) return;
  require(draft != nullptr, "speculative beam search (gamma = {}) needs a draft model", config.gamma);
  const std::string draft_why = draft->beam_obstacle();
  require(draft_why.empty(), "beam search needs tree calls (every beam in one cache): the draft ({} form): {}",
          draft->form(), draft_why);
  require(draft->encoder_decoder() == target.encoder_decoder(), "the target is {} and the draft is not: both must be "
          "encoder-decoder models or both decoder-only", target.encoder_decoder() ? "an encoder-decoder" : "decoder-only");
  if (auto longest = draft->max_source_length(); longest && static_cast<int64_t>(source) > *longest) {
    fail("encoder_input_ids holds {} tokens, more than the draft's max_source_length = {}", source, *longest);
  }
  require(draft->vocab_size() == target.vocab_size(), "the draft's vocabulary ({} tokens) differs from the "
          "target's ({}): speculative beam search compares their tokens", draft->vocab_size(), target.vocab_size());
  require(draft->device() == target.device(), "the draft is on {} and the target on {}: put both on one device",
          draft->device().str(), target.device().str());
}

// The draft's beam search from the running beams (each node once, at its best score), `levels` levels deep: the
// nodes it reached, level by level, u per level at most.
std::vector<int64_t> draft_tree(NodeCache& drafter, Nodes& nodes, const Search& search,
                                const std::vector<int64_t>& running, int64_t levels, int64_t u, int64_t vocab,
                                const at::Tensor& eos) {
  std::vector<int64_t> tree, frontier, first;
  for (size_t i = 0; i < running.size(); ++i) {
    if (std::find(frontier.begin(), frontier.end(), running[i]) != frontier.end()) continue;
    frontier.push_back(running[i]);
    first.push_back(static_cast<int64_t>(i));
  }
  const at::Tensor all = search.running_scores();
  at::Tensor scores = all.index_select(1, upload(first, all.device())).view({-1, 1});
  for (int64_t level = 1; level <= levels; ++level) {
    drafter.run(drafter.missing(frontier, nodes), nodes);
    std::vector<at::Tensor> rows;
    for (int64_t node : frontier) rows.push_back(drafter.logits(node));
    at::Tensor candidates = at::log_softmax(at::stack(rows).to(at::kFloat), -1) + scores;  // [n, V]
    if (eos.defined()) candidates.index_fill_(1, eos, -std::numeric_limits<float>::infinity());
    const auto n = static_cast<int64_t>(frontier.size());
    auto [best, index] = at::topk(candidates.reshape({1, n * vocab}), std::min(u, n * vocab));
    const at::Tensor host_best = best.to(at::kCPU), host_index = index.to(at::kCPU);
    std::vector<int64_t> next, kept;
    for (int64_t c = 0; c < host_index.numel(); ++c) {
      if (!std::isfinite(host_best.data_ptr<float>()[c])) break;  // sorted: the rest are EOS or impossible
      const int64_t flat = host_index.data_ptr<int64_t>()[c];
      next.push_back(nodes.child(frontier[flat / vocab], flat % vocab));
      kept.push_back(c);
    }
    if (next.empty()) break;
    tree.insert(tree.end(), next.begin(), next.end());
    frontier = std::move(next);
    scores = best.index_select(1, upload(kept, best.device())).view({-1, 1});
  }
  return tree;
}

// The target's own beam search steps while its running beams stay within what it ran: how many it took.
int64_t target_steps(const NodeCache& verifier, Nodes& nodes, Search& search, std::vector<int64_t>& running) {
  int64_t steps = 0;
  for (bool inside = true; inside && !search.done();) {
    std::vector<at::Tensor> rows;
    for (int64_t node : running) rows.push_back(verifier.logits(node));
    const std::vector<Search::Next> next = search.step(at::stack(rows));
    steps += 1;
    std::vector<int64_t> moved(running.size());
    for (size_t i = 0; i < running.size(); ++i) {
      moved[i] = nodes.child(running[next[i].beam], next[i].token);
      inside = inside && verifier.has(moved[i]);
    }
    running = std::move(moved);
  }
  return steps;
}

// Keeps the running beams' ancestors in both caches and the node table, drops every other node.
void keep_ancestors(const std::vector<int64_t>& running, Nodes& nodes, NodeCache& verifier, NodeCache* drafter) {
  std::vector<char> keep(nodes.size(), 0);
  for (int64_t node : running) {
    for (int64_t up = node; up >= 0 && !keep[up]; up = nodes.parent(up)) keep[up] = 1;
  }
  verifier.prune(keep);
  if (drafter) drafter->prune(keep);
  nodes.forget_outside(keep);
}

void check_tokens(const std::vector<int64_t>& tokens, const char* name, int64_t vocab) {
  for (int64_t token : tokens) {
    require(token >= 0 && token < vocab, "{} holds token {}, outside the vocabulary [0, {})", name, token, vocab);
  }
}

}  // namespace

BeamSearch beam_search(Model& target, Model* draft, const std::vector<int64_t>& prompt,
                       const std::vector<int64_t>& source, const BeamConfig& config) {
  check_config(config, target, draft, prompt.size(), source.size());
  const auto started = std::chrono::steady_clock::now();
  std::vector<std::mutex*> mutexes{&target.in_use()};
  if (config.gamma > 0) mutexes.push_back(&draft->in_use());
  const std::vector<std::unique_lock<std::mutex>> locks = lock_all(mutexes);
  c10::InferenceMode inference_mode;

  const int64_t w = config.beams, u = config.draft_beams > 0 ? config.draft_beams : w, vocab = target.vocab_size();
  check_tokens(prompt, "prompt_ids", vocab);
  check_tokens(source, "encoder_input_ids", vocab);
  const at::Tensor encoded = source.empty() ? at::Tensor() : at::tensor(source, at::kLong);
  Nodes nodes(prompt.back());
  NodeCache verifier(target, "target", prompt, encoded);
  std::unique_ptr<NodeCache> drafter =
      config.gamma > 0 ? std::make_unique<NodeCache>(*draft, "draft", prompt, encoded) : nullptr;
  Search search(config, static_cast<int64_t>(prompt.size()), vocab, target.device());
  std::vector<int64_t> running(w, 0);  // each running beam's last node
  BeamSearch out;

  at::Tensor eos;
  if (!config.eos_token_ids.empty()) eos = at::tensor(config.eos_token_ids, at::kLong).to(target.device());
  while (!search.done()) {
    const int64_t levels = config.gamma > 0 ? std::min(config.gamma, search.steps_left() - 1) : 0;
    const std::vector<int64_t> tree =
        levels > 0 ? draft_tree(*drafter, nodes, search, running, levels, u, vocab, eos) : std::vector<int64_t>();
    // One target call for the running beams it has not run and the draft's tree.
    std::vector<int64_t> call = verifier.missing(running, nodes);
    call.insert(call.end(), tree.begin(), tree.end());
    verifier.run(call, nodes);
    const int64_t steps = target_steps(verifier, nodes, search, running);
    out.steps += steps;
    out.steps_per_call.push_back(steps);
    keep_ancestors(running, nodes, verifier, drafter.get());
  }
  search.results(out, config.return_sequences);
  out.target_calls = verifier.calls;
  out.target_tokens = verifier.tokens_run;
  if (drafter) {
    out.draft_calls = drafter->calls;
    out.draft_tokens = drafter->tokens_run;
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return out;
}

}  // namespace speculant
