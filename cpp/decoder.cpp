#include "decoder.h"

#include <c10/core/InferenceMode.h>
#include <torch/cuda.h>

#include <chrono>
#include <limits>
#include <mutex>
#include <random>

#include "errors.h"
#include "interrupt.h"
#include "step.h"

namespace speculant {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Accumulates the wall time of one phase into `total`, synchronizing an accelerator first when profiling.
class PhaseTimer {
 public:
  PhaseTimer(double& total, const at::Device& device, bool profile)
      : total_(total), sync_(profile && device.is_cuda()), start_(Clock::now()) {}
  ~PhaseTimer() {
    if (sync_) torch::cuda::synchronize();
    total_ += seconds_since(start_);
  }

 private:
  double& total_;
  bool sync_;
  Clock::time_point start_;
};

void check_ids(const std::vector<int64_t>& ids, const char* name, int64_t vocab) {
  require(!ids.empty(), "{} must hold at least one token id, got an empty sequence", name);
  for (size_t i = 0; i < ids.size(); ++i) {
    require(ids[i] >= 0 && ids[i] < vocab, "{}[{}] = {} is outside the vocabulary [0, {})", name, i, ids[i],
            vocab);
  }
}

// The encoder input: required by encoder-decoder models, refused by decoder-only ones.
void check_source(const Model& target, const std::optional<std::vector<int64_t>>& source) {
  if (!target.encoder_decoder()) {
    require(!source.has_value(), "encoder_input_ids is only for encoder-decoder models; the target is a "
                                 "decoder-only model (prompt_ids holds its whole context)");
    return;
  }
  require(source.has_value(), "the target is an encoder-decoder model: pass encoder_input_ids (the source "
                              "sequence) as well as prompt_ids (the decoder's start)");
  check_ids(*source, "encoder_input_ids", target.vocab_size());
}

void check_source_length(std::optional<int64_t> limit, const char* role, int64_t length) {
  if (limit) {
    require(length <= *limit, "{} model encodes at most max_source_length = {} tokens, encoder_input_ids has {}",
            role, *limit, length);
  }
}

void check_length(std::optional<int64_t> limit, const char* role, int64_t needed) {
  if (limit) {
    require(needed <= *limit,
            "{} model holds at most max_length = {} positions, but the prompt plus max_new_tokens needs {} "
            "(prompt + max_new_tokens - 1)",
            role, *limit, needed);
  }
}

}  // namespace

Decoder::Decoder(std::shared_ptr<Model> target, std::shared_ptr<Drafter> draft, int64_t gamma,
                 SamplingConfig config)
    : target_(std::move(target)), draft_(std::move(draft)), gamma_(gamma), config_(config) {
  require(target_ != nullptr, "target must be a model");
  config_.validate();
  if (!draft_) {
    require(gamma_ == 0, "gamma must be 0 without a draft model, got {}", gamma_);
    return;
  }
  require(gamma_ >= 1, "gamma must be an integer >= 1 (the number of draft tokens per iteration), got {}",
          gamma_);
  require(draft_->model() != target_.get(), "draft and target must be different model handles (each owns its "
                                            "cache); load the file twice to draft with the target itself");
  require(draft_->vocab_size() == target_->vocab_size(),
          "target and draft vocabularies differ: target vocab_size = {}, draft vocab_size = {}. Both models' "
          "logits must index one vocabulary, the same token ids. Models that share a tokenizer often pad their "
          "LM heads differently beyond it (to a multiple of 64 or 128): load the smaller one with "
          "speculant.load(model, vocab_size=<the larger size>), which gives its padded ids -inf logits "
          "(probability 0), so the output law stays exactly the target's",
          target_->vocab_size(), draft_->vocab_size());
  require(draft_->model() == nullptr || draft_->encoder_decoder() == target_->encoder_decoder(),
          "target and draft must both be encoder-decoder models or both decoder-only: the target is {}, the "
          "draft is {}", target_->encoder_decoder() ? "encoder-decoder" : "decoder-only",
          draft_->encoder_decoder() ? "encoder-decoder" : "decoder-only");
  require(draft_->device() == target_->device(), "target and draft must be on the same device: target on {}, "
          "draft on {}", target_->device().str(), draft_->device().str());
}

Generation Decoder::generate(const std::vector<int64_t>& prompt,
                             const std::optional<std::vector<int64_t>>& source, int64_t max_new_tokens,
                             std::optional<int64_t> eos_token_id, std::optional<uint64_t> seed, bool profile,
                             const GammaSchedule& schedule) const {
  if (busy_->exchange(true)) {
    throw std::runtime_error("this decoder is already generating in another thread; a decoder runs one "
                             "generation at a time: create one decoder per thread (decoders may share models)");
  }
  struct Release {
    std::atomic<bool>& flag;
    ~Release() { flag = false; }
  } release{*busy_};
  const int64_t vocab = target_->vocab_size();
  check_ids(prompt, "prompt_ids", vocab);
  check_source(*target_, source);
  require(max_new_tokens >= 0, "max_new_tokens must be >= 0, got {}", max_new_tokens);
  if (eos_token_id) {
    require(*eos_token_id >= 0 && *eos_token_id < vocab, "eos_token_id = {} is outside the vocabulary [0, {})",
            *eos_token_id, vocab);
  }
  std::unique_ptr<GammaPolicy> policy;
  if (draft_) {
    // default max_gamma 2 gamma, saturating; no iteration drafts more than max_new_tokens - 1 tokens
    const int64_t twice = gamma_ > std::numeric_limits<int64_t>::max() / 2 ? std::numeric_limits<int64_t>::max()
                                                                          : 2 * gamma_;
    policy = make_gamma_policy(schedule.policy, gamma_, schedule.max_gamma.value_or(twice), schedule.cost,
                               max_new_tokens - 1);
  }
  const int64_t prompt_length = static_cast<int64_t>(prompt.size());
  check_length(target_->max_length(), "target", prompt_length + max_new_tokens - 1);
  if (draft_) check_length(draft_->max_length(), "draft", prompt_length + max_new_tokens - 1);
  if (source) {
    check_source_length(target_->max_source_length(), "target", static_cast<int64_t>(source->size()));
    if (draft_) check_source_length(draft_->max_source_length(), "draft", static_cast<int64_t>(source->size()));
  }

  // No model call records an autograd graph, whatever its parameters' requires_grad (Python callbacks of
  // live models run on this thread and see the same mode).
  c10::InferenceMode inference_mode;

  // One generation at a time per model and drafter: each owns mutable state.
  std::unique_lock<std::mutex> target_lock(target_->in_use(), std::defer_lock);
  std::unique_lock<std::mutex> draft_lock;
  if (draft_) {
    // a draft model's cache may be shared by several drafters (one per decoder): lock the model itself
    std::mutex& draft_mutex = draft_->model() ? draft_->model()->in_use() : draft_->in_use();
    draft_lock = std::unique_lock<std::mutex>(draft_mutex, std::defer_lock);
    std::lock(target_lock, draft_lock);
  } else {
    target_lock.lock();
  }

  Generation out;
  Stats& stats = out.stats;
  const int64_t max_gamma = policy ? policy->max_gamma() : 0;
  stats.gamma = gamma_;
  stats.drafted_per_position.assign(max_gamma, 0);
  stats.accepted_per_position.assign(max_gamma, 0);
  stats.seed = seed ? *seed : (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
  const auto start = Clock::now();
  const at::Device device = target_->device();
  const auto long_options = at::TensorOptions(device).dtype(at::kLong);
  at::Generator generator = make_generator(device, stats.seed);

  // Invariant between iterations: the target has cached the sequence except its last token, `target_pending`,
  // which it is fed first in the next iteration; the drafter keeps its own state (drafter.h).
  at::Tensor prompt_tensor = at::tensor(prompt, long_options);  // [P]
  at::Tensor target_pending = prompt_tensor.narrow(0, prompt_length - 1, 1);  // [1]
  if (max_new_tokens > 0) {
    // Encoder-decoder: each model encodes the source once (cross-attention keys and values included).
    at::Tensor source_tensor = source ? at::tensor(*source, long_options) : at::Tensor();  // [S]
    {
      PhaseTimer timer(stats.target_seconds, device, profile);
      if (source) target_->encode(source_tensor);
      target_->reset(prompt_tensor.narrow(0, 0, prompt_length - 1));
    }
    if (draft_) {
      PhaseTimer timer(stats.draft_seconds, device, profile);
      if (source) draft_->encode(source_tensor);
      draft_->begin(prompt_tensor, prompt);
    }
  }
  int64_t sequence_length = prompt_length;  // tokens in the sequence, pending ones included

  while (stats.new_tokens < max_new_tokens) {
    // A longer draft than the tokens still wanted would be wasted work (any gamma keeps the law exact).
    const int64_t wanted = policy ? policy->next() : 0;
    const int64_t limit = std::min<int64_t>(wanted, max_new_tokens - stats.new_tokens - 1);
    Proposal proposal;  // limit 0 only in the last iteration (one token still wanted): nothing to draft
    if (limit > 0) {
      check_interrupt();  // the drafter checks again before each of its own model calls
      const auto draft_start = Clock::now();
      proposal = draft_->propose(limit, config_, generator, profile);
      const double draft_total = seconds_since(draft_start);
      stats.draft_seconds += proposal.calls > 0 ? proposal.seconds : draft_total;  // a table's work is the draft's
      stats.draft_calls += proposal.calls;
    }
    const int64_t gamma = proposal.tokens.defined() ? proposal.tokens.numel() : 0;
    at::Tensor drafted = gamma > 0 ? proposal.tokens : at::empty({0}, long_options);  // [gamma]
    // Algorithm 1: run M_p on prefix + [x_1 .. x_gamma] in parallel (one call).
    at::Tensor target_logits;  // [gamma + 1, V]
    check_interrupt();
    {
      PhaseTimer timer(stats.target_seconds, device, profile);
      at::Tensor logits = target_->extend(at::cat({target_pending, drafted}));  // [pending + gamma, V]
      target_logits = logits.narrow(0, logits.size(0) - gamma - 1, gamma + 1);
      stats.target_calls += 1;
    }
    // n leading acceptances, then t ~ residual(p_{n+1}, q_{n+1}) (step.h)
    Verdict verdict = verify_step(target_logits, proposal.q, drafted, proposal.maxima, proposal.finite, config_,
                                  generator);
    require(verdict.finite, "model returned NaN or +inf logits, or an all -inf row, at sequence position {} "
                            "(checked in every draft and target call)", sequence_length);
    const int64_t accepted = verdict.accepted;
    const at::Tensor t = verdict.token;

    Iteration it;
    it.drafted = std::move(verdict.drafted);
    it.accepted = accepted;
    it.token = verdict.host_token;
    it.bonus = accepted == gamma;
    stats.iterations += 1;
    stats.drafted_tokens += gamma;
    stats.accepted_tokens += accepted;
    for (int64_t i = 0; i < gamma; ++i) {
      stats.drafted_per_position[i] += 1;
      stats.accepted_per_position[i] += i < accepted;
    }
    const auto verified = static_cast<int64_t>(verdict.betas.size());  // min(accepted + 1, gamma)
    double beta_sum = 0.0;
    for (const double beta : verdict.betas) beta_sum += beta;
    stats.beta_sum += beta_sum;
    stats.beta_count += verified;
    if (policy && limit > 0) policy->observe(gamma, accepted, beta_sum, verified);

    // Emit x_1 .. x_n, t, stopping at max_new_tokens or just after an EOS.
    bool stop = false;
    for (int64_t i = 0; i <= accepted && !stop; ++i) {
      const int64_t token = i < accepted ? it.drafted[i] : it.token;
      out.tokens.push_back(token);
      it.emitted += 1;
      stats.new_tokens += 1;
      stop = (eos_token_id && token == *eos_token_id) || stats.new_tokens == max_new_tokens;
    }
    if (stop) {
      out.trace.push_back(std::move(it));
      break;
    }

    // Rollback: the target ran on pending + x_1..x_gamma; keep the accepted prefix, t becomes pending.
    const int64_t kept = sequence_length + accepted;  // sequence length after this iteration, minus t
    target_->truncate(kept);
    if (draft_) {  // the draft's rollback is bookkeeping: counted in other_seconds, not in c's draft time
      draft_->advance(accepted, t, std::vector<int64_t>(it.drafted.begin(), it.drafted.begin() + accepted),
                      it.token);
    }
    out.trace.push_back(std::move(it));
    target_pending = t;
    sequence_length += accepted + 1;
  }
  stats.total_seconds = seconds_since(start);
  return out;
}

}  // namespace speculant
