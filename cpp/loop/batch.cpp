#include "loop/batch.h"

#include <ATen/record_function.h>
#include <torch/cuda.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "errors.h"
#include "loop/interrupt.h"
#include "math/cpu_kernels.h"
#include "math/speculative.h"

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

}  // namespace

Row make_row(bool drafting, int64_t gamma, const GammaSchedule& schedule, int64_t cap,
             const std::vector<int64_t>& tree_shape, const at::Device& device, uint64_t seed) {
  Row row;
  if (drafting) {
    // default max_gamma 2 gamma, saturating; no iteration drafts more than `cap` tokens
    const int64_t twice = gamma > std::numeric_limits<int64_t>::max() / 2 ? std::numeric_limits<int64_t>::max()
                                                                          : 2 * gamma;
    row.policy = make_gamma_policy(schedule.policy, gamma, schedule.max_gamma.value_or(twice), schedule.cost, cap);
  }
  Stats& stats = row.out.stats;
  const int64_t max_gamma = row.policy ? row.policy->max_gamma() : 0;
  stats.gamma = gamma;
  stats.drafted_per_position.assign(max_gamma, 0);
  stats.accepted_per_position.assign(max_gamma, 0);
  stats.tree_visits.assign(tree_shape.size(), 0);
  for (const int64_t children : tree_shape) stats.tree_accepted.emplace_back(children, 0);
  stats.tree_offered = stats.tree_accepted;
  stats.seed = seed;
  row.streams = Streams(device, seed);
  return row;
}

Batch::Batch(Setup setup, std::vector<Row>& rows, std::unique_ptr<ModelRows> target_rows,
             std::unique_ptr<DraftRows> draft_rows)
    : s_(std::move(setup)), rows_(rows), target_rows_(std::move(target_rows)), draft_rows_(std::move(draft_rows)),
      device_(s_.target.device()), tensor_path_(!cpu::runs_on_host(device_)), clock_(device_, s_.profile),
      start_(Clock::now()) {
  if (!s_.trees) s_.siblings = Siblings::with_replacement;  // one child per node: every rule is Algorithm 1's step
}

void Batch::start(const std::vector<std::vector<int64_t>>& prompts) {
  const auto long_options = at::TensorOptions(device_).dtype(at::kLong);
  for (size_t r = 0; r < rows_.size(); ++r) {
    rows_[r].pending = at::tensor(prompts[r], long_options);  // [P]: prefill caches all but the last
    rows_[r].sequence_length = static_cast<int64_t>(prompts[r].size());
  }
}

void Batch::prefill(const std::vector<std::vector<int64_t>>& prompts,
                    const std::vector<std::vector<int64_t>>& sources) {
  const auto long_options = at::TensorOptions(device_).dtype(at::kLong);
  std::vector<at::Tensor> whole(rows_.size()), cached(rows_.size());
  for (size_t r = 0; r < rows_.size(); ++r) {
    Row& row = rows_[r];
    whole[r] = row.pending;
    cached[r] = row.pending.narrow(0, 0, row.pending.numel() - 1);
    row.pending = row.pending.narrow(0, row.pending.numel() - 1, 1);  // [1]
  }
  // Encoder-decoder: each model encodes each source once (cross-attention keys and values included).
  std::vector<at::Tensor> source_tensors;
  for (const auto& source : sources) source_tensors.push_back(at::tensor(source, long_options));  // [S]
  timed(&Stats::target_seconds, [&] {
    if (!source_tensors.empty()) target_rows_->encode(source_tensors);
    target_rows_->reset(cached);
  });
  if (draft_rows_) {
    timed(&Stats::draft_seconds, [&] {
      draft_rows_->begin(source_tensors, whole, prompts);
    });
  }
}

bool Batch::running() const {
  return std::any_of(rows_.begin(), rows_.end(), [](const Row& row) { return row.running; });
}

// Each phase in a profiler scope of its own (free when no profiler runs): benchmarks/overhead.py counts the
// operations each launches.
void Batch::iterate() {
  clock_.settle([this](size_t r) -> Stats& { return rows_[r].out.stats; });  // the last iteration read back
  {
    RECORD_USER_SCOPE("speculant::draft");
    draft();
  }
  std::vector<Verdict> verdicts;
  {
    RECORD_USER_SCOPE("speculant::verify");
    verdicts = verify();
  }
  RECORD_USER_SCOPE("speculant::accept");
  accept(verdicts);
}

// What each row drafts: up to gamma tokens from its gamma policy, a chain, or (trees) the tree of that depth the plan
// lays out, built into `trees`. A longer draft than the tokens still wanted would be wasted work (any gamma keeps the
// law exact); limit 0 only in a row's last iteration (one token still wanted) and for rows that stopped. Every node
// of a tree takes a cache slot until the accepted path is kept, so near max_length a row's tree shrinks until its
// nodes fit beside the cached tokens (any tree chosen before drawing keeps the law exact); the root alone always
// fits (Decoder::check_inputs).
std::vector<Layout> Batch::layouts(std::vector<std::optional<TreeDraft>>& trees) const {
  std::vector<Layout> out(rows_.size());
  for (size_t r = 0; r < rows_.size(); ++r) {
    const Row& row = rows_[r];
    if (row.limit == 0) continue;
    if (!s_.trees) {
      out[r].gamma = row.limit;
      continue;
    }
    trees[r].emplace(s_.trees->draft(row.limit, room(row)));
    out[r].tree = &*trees[r];
  }
  return out;
}

// Draft: each running row's proposal, every row's from one call of the drafter.
void Batch::draft() {
  bool drafting = false;
  for (Row& row : rows_) {
    const int64_t wanted = row.running && row.policy ? row.policy->next() : 0;
    row.limit = row.running ? std::min<int64_t>(wanted, row.stop_at - row.out.stats.new_tokens - 1) : 0;
    row.proposal = Proposal{};
    drafting = drafting || row.limit > 0;
    if (row.running) row.streams.start(row.step++);
  }
  if (draft_rows_) {  // even when no row drafts: the drafter learns that none did (commit follows)
    std::vector<std::optional<TreeDraft>> trees(rows_.size());
    const std::vector<Layout> layouts = this->layouts(trees);
    if (drafting) check_interrupt();  // the drafter checks again before each of its own model calls
    std::vector<at::Generator> generators;
    for (Row& row : rows_) generators.push_back(row.streams.draft);  // handles: the rows' own draft streams
    const auto draft_start = Clock::now();
    clock_.begin();
    std::vector<Proposal> proposals = draft_rows_->propose(layouts, s_.config, s_.siblings, generators,
                                                           DraftMode{tensor_path_, s_.profile});
    const double draft_total = seconds_since(draft_start);
    std::vector<size_t> drafted;
    for (size_t r = 0; r < rows_.size(); ++r) {
      Row& row = rows_[r];
      if (!layouts[r].drafts()) continue;
      row.proposal = std::move(proposals[r]);
      drafted.push_back(r);
      if (!clock_.active()) {  // a drafter that calls no model and times nothing itself: the whole call's time
        const bool timed = row.proposal.calls > 0 || row.proposal.seconds > 0.0;
        row.out.stats.draft_seconds += timed ? row.proposal.seconds : draft_total;
      }
      row.out.stats.draft_calls += row.proposal.calls;
    }
    clock_.end(&Stats::draft_seconds, std::move(drafted));  // the phase's device time, for each drafting row
  }
  const auto long_options = at::TensorOptions(device_).dtype(at::kLong);
  for (Row& row : rows_) {
    if (!row.proposal.tokens.defined()) row.proposal.tokens = at::empty({0}, long_options);  // [N]
  }
}

// Each running row's target input, [pending, its drafts] (a tree's nodes breadth-first): where every row's has the
// same shape (the usual case) the batch's are joined in three operations, else row by row. Undefined for the rows
// not running.
std::vector<at::Tensor> Batch::target_inputs() const {
  std::vector<at::Tensor> inputs(rows_.size()), pending, drafted;
  std::vector<size_t> running;
  for (size_t r = 0; r < rows_.size(); ++r) {
    if (!rows_[r].running) continue;
    running.push_back(r);
    pending.push_back(rows_[r].pending);
    drafted.push_back(rows_[r].proposal.tokens);
  }
  const auto same = [](const std::vector<at::Tensor>& tensors) {
    const int64_t size = tensors.empty() ? 0 : tensors[0].numel();
    return std::all_of(tensors.begin(), tensors.end(), [size](const at::Tensor& t) { return t.numel() == size; });
  };
  if (running.size() > 1 && same(pending) && same(drafted)) {
    const at::Tensor all = at::cat({at::stack(pending), at::stack(drafted)}, 1);  // [R, k]
    for (size_t i = 0; i < running.size(); ++i) inputs[running[i]] = all.select(0, static_cast<int64_t>(i));
  } else {
    for (size_t i = 0; i < running.size(); ++i) inputs[running[i]] = at::cat({pending[i], drafted[i]});
  }
  return inputs;
}

// The target's one call for every running row: a chain's drafts appended to its cache (extend, which every backend
// has), a tree's as tentative nodes (extend_tree: the root's pending token, then each node after its parent),
// whose accepted paths keep_paths keeps. Returns each running row's logits [pending + N, V].
std::vector<at::Tensor> Batch::target_call(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Tensor> logits;
  if (!s_.trees) {
    timed(&Stats::target_seconds, [&] { logits = target_rows_->extend(inputs); });
    return logits;
  }
  std::vector<ModelRows::TreeNodes> nodes(rows_.size());
  for (size_t r = 0; r < rows_.size(); ++r) {
    if (!rows_[r].running) continue;
    const Tree& tree = rows_[r].proposal.tree;
    for (int64_t v = 0; v < tree.size(); ++v) {
      nodes[r].offsets.push_back(tree.depth(v));
      nodes[r].parents.push_back(tree.parent(v));
    }
  }
  timed(&Stats::target_seconds, [&] { logits = target_rows_->extend_tree(inputs, nodes); });
  return logits;
}

// Verify: Algorithm 1 runs M_p on prefix + the drafts in parallel (one call for every running row), then every
// running row's verification at once (tree.h: verify_drafts, the one verifier of chains and trees), each row with its
// own streams. A chain comes in its own form (tree.h: TreeInput), a tree with the root's token and a law for each
// node. Returns the verdicts of the running rows, in row order.
std::vector<Verdict> Batch::verify() {
  const std::vector<at::Tensor> inputs = target_inputs();
  check_interrupt();
  const std::vector<at::Tensor> logits = target_call(inputs);
  // a tree row that drafted nothing (the root alone) has no laws: rows nothing reads, the sibling's too where the
  // batch has a sibling draft (the verification takes every row's or none)
  const bool sibling_law = std::any_of(rows_.begin(), rows_.end(), [](const Row& row) {
    return row.running && row.proposal.sibling_q.defined();
  });
  std::vector<TreeInput> checks;
  for (size_t r = 0; r < rows_.size(); ++r) {
    Row& row = rows_[r];
    if (!row.running) continue;
    const Proposal& proposal = row.proposal;
    const int64_t nodes = proposal.tree.size();
    const at::Tensor verified = logits[r].narrow(0, logits[r].size(0) - nodes, nodes);  // [N + 1, V]
    if (s_.laws) row.logits = verified;
    at::Tensor q = proposal.q, sibling_q = proposal.sibling_q;
    if (!q.defined()) q = s_.trees ? at::zeros_like(verified) : verified.narrow(0, 0, 0);
    if (!sibling_q.defined() && sibling_law) sibling_q = at::zeros_like(q);
    checks.push_back({&proposal.tree, verified, q, s_.trees ? inputs[r] : proposal.tokens, proposal.maxima,
                      &row.streams.coins, &row.streams.correction, sibling_q, proposal.finite});
  }
  return verify_drafts(checks, s_.config, s_.siblings, s_.verify_graphs);
}

// Accept and emit, then roll back, for each running row (verdicts in row order, as verify returns them). The target ran
// on pending and the drafts: it keeps the accepted path, and t becomes pending. The draft's rollback is bookkeeping:
// counted in other_seconds, not in c's draft time.
void Batch::accept(std::vector<Verdict>& verdicts) {
  size_t next = 0;
  std::vector<int64_t> committing;
  std::vector<std::vector<int64_t>> kept;  // each row's root (the pending token) and accepted path
  for (size_t r = 0; r < rows_.size(); ++r) {
    Row& row = rows_[r];
    if (!row.running) continue;
    Verdict& verdict = verdicts[next++];
    require_finite(row, r, verdict.finite);
    Iteration it = record(row, verdict);
    const bool stopped = emit(row, it);
    if (s_.laws) {  // a hierarchical draft's level (chains): what it emitted and its model's laws there
      const at::Tensor& drafted = row.proposal.tokens;
      row.emitted.push_back(it.emitted > it.accepted ? at::cat({drafted.narrow(0, 0, it.accepted), verdict.token})
                                                     : drafted.narrow(0, 0, it.emitted));
      row.laws.push_back(standardize(row.logits.narrow(0, 0, it.emitted), s_.config));
    }
    const auto index = static_cast<int64_t>(r);
    committing.push_back(index);
    kept.push_back({0});
    kept.back().insert(kept.back().end(), verdict.path.begin(), verdict.path.end());
    if (draft_rows_) {
      draft_rows_->commit(index, Commit::accepted(verdict.path, verdict.path_tokens, verdict.token,
                                                  verdict.host_token));
    }
    row.pending = verdict.token;
    row.sequence_length += it.accepted + 1;
    end(row, it, stopped);
  }
  keep_paths(committing, kept);
}

// The target keeps each committing row's root (the pending token verified) and accepted path, as target_call appended
// them: a tree's tentative nodes through commit (every row's in one call where the rows can), a chain's appended
// drafts by truncation, its cache then holding the sequence but the new pending token.
void Batch::keep_paths(const std::vector<int64_t>& committing, const std::vector<std::vector<int64_t>>& kept) {
  if (s_.trees) {
    target_rows_->commit(committing, kept);
    return;
  }
  for (const int64_t r : committing) target_rows_->truncate(r, rows_[r].sequence_length - 1);
}

void Batch::restart(int64_t r, int64_t length, const at::Tensor& t, int64_t t_host) {
  Row& row = rows_[r];
  row.pending = restart_row(*target_rows_, r, row.pending, length, t);
  if (draft_rows_) draft_rows_->commit(r, Commit::restart(length, t, t_host));
  row.sequence_length = length + 1;
}

void Batch::finish() {
  clock_.settle([this](size_t r) -> Stats& { return rows_[r].out.stats; });
  for (size_t r = 0; r < rows_.size(); ++r) {
    Row& row = rows_[r];
    if (row.out.stats.total_seconds == 0.0) row.out.stats.total_seconds = seconds_since(start_);
    if (draft_rows_) row.out.levels = draft_rows_->levels(static_cast<int64_t>(r));
  }
}

// Runs `phase`, charging its time to every running row's `field` (model calls of a phase serve them all).
template <typename Phase>
void Batch::timed(double Stats::*field, const Phase& phase) {
  if (clock_.active()) {  // the device's time, read at the next settle()
    std::vector<size_t> running;
    for (size_t r = 0; r < rows_.size(); ++r) {
      if (rows_[r].running) running.push_back(r);
    }
    clock_.begin();
    phase();
    clock_.end(field, std::move(running));
    return;
  }
  double seconds = 0.0;
  {
    PhaseTimer timer(seconds, device_, s_.profile);
    phase();
  }
  for (Row& row : rows_) {
    if (row.running) row.out.stats.*field += seconds;
  }
}

// The iteration's statistics: drafted and accepted per position, the betas (Theorem 3.5), the gamma policy, and for a
// tree the depths and ranks of its acceptances. A chain's trace lists every draft, a tree's its accepted path.
Iteration Batch::record(Row& row, Verdict& verdict) {
  Stats& stats = row.out.stats;
  const Tree& tree = row.proposal.tree;
  const int64_t depth = tree.depth(), accepted = verdict.accepted();
  Iteration it;
  it.drafted = s_.trees ? verdict.path_tokens : std::move(verdict.drafted);
  it.accepted = accepted;
  it.token = verdict.host_token;
  it.bonus = accepted == depth;
  if (s_.trees) it.tree = tree.parents();
  it.inner = std::move(row.proposal.inner);
  stats.target_calls += 1;
  stats.iterations += 1;
  stats.drafted_tokens += tree.size() - 1;
  stats.accepted_tokens += accepted;
  for (int64_t i = 0; i < depth; ++i) {
    stats.drafted_per_position[i] += 1;
    stats.accepted_per_position[i] += i < accepted;
  }
  if (s_.trees) {
    record_tree_ranks(stats, tree, verdict);
    // the drafts kept in expectation by the rule that ran (tree.h: expected_kept); at T = 0 both rules' verdict
    const bool block = s_.config.block(), both = s_.config.greedy();
    (block ? stats.block_kept_sum : stats.token_kept_sum) += verdict.kept_in_expectation;
    double& other = block ? stats.token_kept_sum : stats.block_kept_sum;
    other = both ? other + verdict.kept_in_expectation : std::numeric_limits<double>::quiet_NaN();
    stats.predicted_iterations += 1;
  } else {  // each rule's drafts kept in expectation on these drafts (speculative.h)
    const double lenience = s_.config.lenience;
    stats.token_kept_sum += expected_kept(verdict.ratios, lenience, false);
    stats.block_kept_sum += lenience == 1.0 ? expected_kept(verdict.ratios, 1.0, true)
                                            : std::numeric_limits<double>::quiet_NaN();
    stats.predicted_iterations += 1;
  }
  const auto verified = static_cast<int64_t>(verdict.betas.size());
  double beta_sum = 0.0;
  for (const double beta : verdict.betas) beta_sum += beta;
  stats.beta_sum += beta_sum;
  stats.beta_count += verified;
  if (row.policy && row.limit > 0) row.policy->observe(depth, accepted, beta_sum, verified);
  return it;
}

// Stats::tree_visits / tree_offered / tree_accepted: at each node of the accepted path with children (the root
// included), the ranks offered and the one accepted (Stats sizes them for the generation's trees).
void Batch::record_tree_ranks(Stats& stats, const Tree& tree, const Verdict& verdict) const {
  for (size_t i = 0; i < verdict.accepted_rank.size(); ++i) {
    const int64_t node = i == 0 ? 0 : verdict.path[i - 1];
    if (tree.children(node) == 0) continue;
    stats.tree_visits[i] += 1;
    for (int64_t j = 0; j < tree.children(node); ++j) stats.tree_offered[i][j] += 1;
    if (verdict.accepted_rank[i] >= 0) stats.tree_accepted[i][verdict.accepted_rank[i]] += 1;
  }
}

// How many tree nodes (the root included) both models' caches hold beside the row's cached tokens.
int64_t Batch::room(const Row& row) const {
  int64_t most = std::numeric_limits<int64_t>::max();
  for (const std::optional<int64_t> limit : {s_.target.max_length(), s_.draft ? s_.draft->max_length()
                                                                               : std::optional<int64_t>()}) {
    if (limit) most = std::min(most, *limit - (row.sequence_length - 1));
  }
  return most;
}

// ValueError unless the verification of row r saw finite logits.
void Batch::require_finite(const Row& row, size_t r, bool finite) const {
  require(finite, "model returned NaN or +inf logits, or an all -inf row, at sequence position {}{} "
          "(checked in every draft and target call)", row.sequence_length,
          rows_.size() == 1 ? std::string() : fmt::format(" of row {}", r));
}

// Emits x_1 .. x_n, t, stopping at the row's stop_at or just after an EOS. Returns whether the row stopped.
bool Batch::emit(Row& row, Iteration& it) {
  Stats& stats = row.out.stats;
  for (int64_t i = 0; i <= it.accepted; ++i) {
    const int64_t token = i < it.accepted ? it.drafted[i] : it.token;
    row.out.tokens.push_back(token);
    it.emitted += 1;
    stats.new_tokens += 1;
    if (stats.new_tokens == row.stop_at || is_eos(token)) return true;
  }
  return false;
}

// Records the iteration; a stopped row ends with its time.
void Batch::end(Row& row, Iteration& it, bool stopped) {
  row.out.trace.push_back(std::move(it));
  if (!stopped) return;
  row.running = false;
  row.out.stats.total_seconds = seconds_since(start_);
}

bool Batch::is_eos(int64_t token) const {
  return std::find(s_.eos_token_ids.begin(), s_.eos_token_ids.end(), token) != s_.eos_token_ids.end();
}

}  // namespace speculant
