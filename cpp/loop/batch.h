// The phases of Algorithm 1 over a batch of rows (draft, verify, accept and emit, roll back), each row on its
// own: what Decoder::generate_batch runs to the end of a generation, and what a hierarchical draft
// (hierarchy.h) runs a few tokens at a time, as the draft level of another loop.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "device/device_clock.h"
#include "drafting/drafter.h"
#include "drafting/gamma_policy.h"
#include "math/streams.h"
#include "models/model.h"
#include "math/sampling.h"
#include "loop/stats.h"
#include "math/tree.h"
#include "drafting/tree_growth.h"

namespace speculant {

struct Generation {
  std::vector<int64_t> tokens;  // the new tokens (an EOS that stopped the run included)
  Stats stats;
  std::vector<Iteration> trace;
  // A hierarchical draft's levels below this one (hierarchy.h): levels[0] is the draft decoder's own
  // statistics (its target is this generation's draft model), levels[1] the next level's, and so on.
  std::vector<Stats> levels;
};

// One row of a batch between iterations: the target has cached the sequence except its last token(s),
// `pending`, which it is fed first in the next iteration; the drafter keeps its own state (drafter.h).
struct Row {
  Generation out;
  std::unique_ptr<GammaPolicy> policy;
  Streams streams;              // the draft's, the coins' and the correction's (streams.h)
  uint64_t step = 0;            // the iterations started, which key the streams
  at::Tensor pending;           // [m >= 1] int64 on the device
  int64_t sequence_length = 0;  // tokens in the sequence, pending ones included
  int64_t stop_at = 0;          // the row stops when out.stats.new_tokens reaches this (or after an EOS)
  bool running = true;
  // Batch::Setup::laws: the tokens emitted since they were last cleared (int64 [n] on the device, never read
  // back) and the target's standardized law at each of them [n, V]
  std::vector<at::Tensor> emitted, laws;
  // the current iteration
  int64_t limit = 0;            // most tokens to draft (a tree's depth)
  Proposal proposal;            // its drafts: a chain, or a tree
  at::Tensor logits;            // Setup::laws: the target's logits at the verified positions [gamma + 1, V]
};

// A row's gamma policy (none without a drafter), statistics sized for it and for `tree_shape`, and streams.
Row make_row(bool drafting, int64_t gamma, const GammaSchedule& schedule, int64_t cap,
             const std::vector<int64_t>& tree_shape, const at::Device& device, uint64_t seed);

class Batch {
 public:
  struct Setup {
    Model& target;
    Drafter* draft;
    SamplingConfig config;
    std::vector<int64_t> eos_token_ids;
    bool profile;
    const TreePlan* trees;  // token trees; null for chains
    Siblings siblings;
    bool laws = false;  // keep each emitted token on the device with its standardized target law (Row::laws)
    VerificationGraphs* verify_graphs = nullptr;  // the verification's fixed-shape buffers (verification_graphs.h)
  };

  Batch(Setup setup, std::vector<Row>& rows, std::unique_ptr<ModelRows> target_rows,
        std::unique_ptr<DraftRows> draft_rows);

  // Each row's sequence is prompts[r] (its last token pending); no model runs.
  void start(const std::vector<std::vector<int64_t>>& prompts);
  // After start(prompts): encodes the sources (encoder-decoders; empty for decoder-only) and runs each prompt
  // but its last token through both models.
  void prefill(const std::vector<std::vector<int64_t>>& prompts, const std::vector<std::vector<int64_t>>& sources);
  bool running() const;
  // One iteration of Algorithm 1 for every running row: draft, verify, accept and emit, roll back.
  void iterate();
  // Row r's sequence becomes its first `length` tokens (at least one, at most its length now) followed by t
  // (int64 [1] on the device; t_host on the host), in both models; between iterations.
  void restart(int64_t r, int64_t length, const at::Tensor& t, int64_t t_host);
  // Sets each row's total time (the rows still running: until now) and its draft levels' statistics.
  void finish();

  Setup& setup() { return s_; }
  DraftRows* draft_rows() const { return draft_rows_.get(); }

 private:
  using Clock = std::chrono::steady_clock;

  std::vector<Layout> layouts(std::vector<std::optional<TreeDraft>>& trees) const;
  void draft();
  std::vector<at::Tensor> target_inputs() const;
  std::vector<at::Tensor> target_call(const std::vector<at::Tensor>& inputs);
  std::vector<Verdict> verify();
  void accept(std::vector<Verdict>& verdicts);
  void keep_paths(const std::vector<int64_t>& committing, const std::vector<std::vector<int64_t>>& kept);

  template <typename Phase>
  void timed(double Stats::*field, const Phase& phase);
  Iteration record(Row& row, Verdict& verdict);
  void record_tree_ranks(Stats& stats, const Tree& tree, const Verdict& verdict) const;
  int64_t room(const Row& row) const;
  void require_finite(const Row& row, size_t r, bool finite) const;
  bool emit(Row& row, Iteration& it);
  void end(Row& row, Iteration& it, bool stopped);
  bool is_eos(int64_t token) const;

  Setup s_;
  std::vector<Row>& rows_;
  std::unique_ptr<ModelRows> target_rows_;
  std::unique_ptr<DraftRows> draft_rows_;
  at::Device device_;
  bool tensor_path_;   // the drafts run on the tensor path (drafter.h: DraftMode), for the whole generation
  DeviceClock clock_;  // the phases' device time on a GPU (device_clock.h)
  Clock::time_point start_;
};

}  // namespace speculant
