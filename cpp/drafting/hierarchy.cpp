#include "drafting/hierarchy.h"

#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "loop/batch.h"
#include "errors.h"

namespace speculant {
namespace {

using Clock = std::chrono::steady_clock;

std::optional<int64_t> smaller(std::optional<int64_t> a, std::optional<int64_t> b) {
  if (!a) return b;
  if (!b) return a;
  return std::min(*a, *b);
}

// The draft level's rows: a Batch of its own pair, run a few tokens at a time (hierarchy.h).
class HierarchyRows final : public DraftRows {
 public:
  HierarchyRows(Model& model, Drafter& drafter, int64_t gamma, const GammaSchedule& schedule, int64_t count,
                std::unique_ptr<ModelRows> model_rows, std::unique_ptr<DraftRows> drafter_rows)
      : rows_(make_rows(gamma, schedule, count, model.device())), start_length_(count, 0),
        batch_(Batch::Setup{model, &drafter, SamplingConfig{}, {}, false, nullptr, Siblings::with_replacement,
                            /*laws=*/true},
               rows_, std::move(model_rows), std::move(drafter_rows)),
        device_(model.device()) {}

  void begin(const std::vector<at::Tensor>& sources, const std::vector<at::Tensor>&,
             const std::vector<std::vector<int64_t>>& host_prompts) override {
    std::vector<std::vector<int64_t>> host_sources;
    for (const at::Tensor& source : sources) {
      const at::Tensor host = source.to(at::kCPU);
      host_sources.emplace_back(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
    }
    batch_.start(host_prompts);
    batch_.prefill(host_prompts, host_sources);
  }

  std::vector<Proposal> draw(const std::vector<Layout>& layouts, const SamplingConfig& config, Siblings,
                             std::vector<at::Generator>& generators, DraftMode mode) override {
    std::vector<int64_t> gammas;
    for (const Layout& layout : layouts) {
      require(!layout.tree, "a hierarchical draft's rows draft chains, not token trees");
      gammas.push_back(layout.gamma);
    }
    Batch::Setup& setup = batch_.setup();
    setup.config = config;
    setup.config.lenience = 1.0;  // this level's output law must be its model's own (hierarchy.h)
    setup.profile = mode.profile;
    std::vector<double> before(rows_.size());
    std::vector<size_t> traced(rows_.size());
    for (size_t r = 0; r < rows_.size(); ++r) {
      Row& row = rows_[r];
      row.running = gammas[r] > 0;
      row.stop_at = row.out.stats.new_tokens + gammas[r];
      row.streams.reseat(generators[r].current_seed());  // keyed by the outer row's draft stream at this step
      row.step = 0;
      row.emitted.clear();
      row.laws.clear();
      start_length_[r] = row.sequence_length;
      before[r] = row.out.stats.total_seconds;
      traced[r] = row.out.trace.size();
    }
    const auto start = Clock::now();
    while (batch_.running()) batch_.iterate();
    if (mode.profile && device_.is_cuda()) torch::cuda::synchronize();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    std::vector<Proposal> out(rows_.size());
    for (size_t r = 0; r < rows_.size(); ++r) {
      Row& row = rows_[r];
      row.out.stats.total_seconds = before[r] + (gammas[r] > 0 ? seconds : 0.0);
      if (gammas[r] == 0) continue;
      Proposal& proposal = out[r];
      proposal.tokens = at::cat(row.emitted);  // [gamma], on the device: no host copy
      proposal.q = at::cat(row.laws);          // [gamma, V]
      row.out.tokens.clear();                  // the level's sequence lives in its caches, not here
      proposal.seconds = seconds;
      auto first = row.out.trace.begin() + static_cast<std::ptrdiff_t>(traced[r]);
      proposal.inner.assign(std::make_move_iterator(first), std::make_move_iterator(row.out.trace.end()));
      row.out.trace.erase(first, row.out.trace.end());
    }
    return out;
  }

  // The level cuts its sequence back to where the proposal began, the kept drafts and t (hierarchy.h).
  void commit(int64_t row, const Commit& commit) override {
    const int64_t keep = commit.keep >= 0 ? commit.keep
                                          : start_length_[row] + static_cast<int64_t>(commit.path.size());
    batch_.restart(row, keep, commit.t, commit.t_host);
  }

  std::vector<Stats> levels(int64_t row) const override {
    std::vector<Stats> out{rows_[row].out.stats};
    const std::vector<Stats> below = batch_.draft_rows()->levels(row);
    out.insert(out.end(), below.begin(), below.end());
    return out;
  }

 private:
  static std::vector<Row> make_rows(int64_t gamma, const GammaSchedule& schedule, int64_t count,
                                    const at::Device& device) {
    std::vector<Row> rows;
    for (int64_t r = 0; r < count; ++r) {
      // the streams are keyed anew with each proposal, by the outer row's draft stream
      rows.push_back(make_row(true, gamma, schedule, std::numeric_limits<int64_t>::max(), {}, device, 0));
      rows.back().running = false;
    }
    return rows;
  }

  std::vector<Row> rows_;
  std::vector<int64_t> start_length_;  // each row's sequence length when its last proposal began
  Batch batch_;
  at::Device device_;
};

DrafterFacts hierarchy_facts(Model& model, Drafter& drafter) {
  std::vector<std::mutex*> locks{&model.in_use()};
  const std::vector<std::mutex*> below = drafter.locks();
  locks.insert(locks.end(), below.begin(), below.end());
  return {fmt::format("speculative decoder (over a {} drafter)", drafter.name()), model.vocab_size(), model.device(),
          model.encoder_decoder(), smaller(model.max_length(), drafter.max_length()),
          smaller(model.max_source_length(), drafter.max_source_length()),
          [] {
            return std::string("a speculative decoder used as the draft (a hierarchical draft) proposes chains only");
          },
          &model, std::move(locks)};
}

class HierarchyDrafter final : public Drafter {
 public:
  HierarchyDrafter(std::shared_ptr<Model> model, std::shared_ptr<Drafter> drafter, int64_t gamma,
                   GammaSchedule schedule, Shapes drafter_shapes)
      : Drafter(hierarchy_facts(*model, *drafter)), model_(std::move(model)), drafter_(std::move(drafter)),
        gamma_(gamma), schedule_(std::move(schedule)), drafter_shapes_(drafter_shapes) {}

 protected:
  std::unique_ptr<DraftRows> make_rows(int64_t count, Shapes shapes, bool) override {
    return std::make_unique<HierarchyRows>(*model_, *drafter_, gamma_, schedule_, count, model_->rows(count, shapes),
                                           drafter_->rows(count, drafter_shapes_, false));
  }

 private:
  std::shared_ptr<Model> model_;
  std::shared_ptr<Drafter> drafter_;
  int64_t gamma_;
  GammaSchedule schedule_;
  Shapes drafter_shapes_;
};

}  // namespace

std::shared_ptr<Drafter> hierarchy_drafter(std::shared_ptr<Model> model, std::shared_ptr<Drafter> drafter,
                                           int64_t gamma, const GammaSchedule& schedule, Shapes drafter_shapes) {
  require(model != nullptr && drafter != nullptr, "a hierarchical draft needs a model and its drafter");
  require(gamma >= 1, "gamma of the draft level must be >= 1, got {}", gamma);
  make_gamma_policy(schedule.policy, gamma, schedule.max_gamma.value_or(2 * gamma), schedule.cost, gamma);
  return std::make_shared<HierarchyDrafter>(std::move(model), std::move(drafter), gamma, schedule, drafter_shapes);
}

}  // namespace speculant
