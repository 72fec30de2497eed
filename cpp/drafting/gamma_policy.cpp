#include "drafting/gamma_policy.h"

#include <algorithm>
#include <cmath>

#include "errors.h"

namespace speculant {
namespace {

class FixedGamma final : public GammaPolicy {
 public:
  explicit FixedGamma(int64_t gamma) : gamma_(gamma) {}
  int64_t next() const override { return gamma_; }
  void observe(int64_t, int64_t, double, int64_t) override {}
  int64_t max_gamma() const override { return gamma_; }

 private:
  int64_t gamma_;
};

class HeuristicGamma final : public GammaPolicy {
 public:
  HeuristicGamma(int64_t gamma, int64_t max_gamma) : gamma_(gamma), max_(max_gamma) {}
  int64_t next() const override { return gamma_; }
  void observe(int64_t drafted, int64_t accepted, double, int64_t) override {
    if (drafted == 0) return;  // nothing was learned
    gamma_ = accepted == drafted ? std::min(gamma_ + 2, max_) : std::max<int64_t>(gamma_ - 1, 1);
  }
  int64_t max_gamma() const override { return max_; }

 private:
  int64_t gamma_, max_;
};

class AlphaGamma final : public GammaPolicy {
 public:
  AlphaGamma(int64_t max_gamma, double cost) : max_(max_gamma), cost_(cost) { update(); }
  int64_t next() const override { return gamma_; }
  void observe(int64_t, int64_t, double beta_sum, int64_t verified) override {
    if (verified == 0) return;
    const double kWeight = 0.1;  // per verified position
    const double keep = std::pow(1.0 - kWeight, static_cast<double>(verified));
    alpha_ = keep * alpha_ + (1.0 - keep) * (beta_sum / static_cast<double>(verified));
    update();
  }
  int64_t max_gamma() const override { return max_; }

 private:
  void update() { gamma_ = best_gamma(alpha_, cost_, max_); }
  int64_t max_;
  double cost_;
  double alpha_ = 0.5;
  int64_t gamma_ = 1;
};

}  // namespace

double walltime_improvement(double alpha, int64_t gamma, double cost) {
  const double tokens = alpha >= 1.0 ? static_cast<double>(gamma + 1)
                                     : (1.0 - std::pow(alpha, static_cast<double>(gamma + 1))) / (1.0 - alpha);
  return tokens / (static_cast<double>(gamma) * cost + 1.0);
}

int64_t best_gamma(double alpha, double cost, int64_t max_gamma) {
  int64_t best = 1;
  for (int64_t g = 2; g <= max_gamma; ++g) {
    if (!(walltime_improvement(alpha, g, cost) > walltime_improvement(alpha, best, cost))) break;
    best = g;
  }
  return best;
}

std::unique_ptr<GammaPolicy> make_gamma_policy(const std::string& name, int64_t gamma, int64_t max_gamma,
                                               double cost, int64_t cap) {
  require(gamma >= 1, "gamma must be an integer >= 1, got {}", gamma);
  cap = std::max<int64_t>(cap, 1);
  if (name == "fixed") return std::make_unique<FixedGamma>(std::min(gamma, cap));
  require(max_gamma >= gamma, "max_gamma must be >= gamma = {}, got {}", gamma, max_gamma);
  gamma = std::min(gamma, cap);
  max_gamma = std::min(max_gamma, cap);
  if (name == "heuristic") return std::make_unique<HeuristicGamma>(gamma, max_gamma);
  if (name == "alpha") {
    require(std::isfinite(cost) && cost >= 0, "cost (the coefficient c) must be a finite number >= 0 for the "
                                               "'alpha' gamma policy, got {}", cost);
    return std::make_unique<AlphaGamma>(max_gamma, cost);
  }
  fail("gamma_policy must be 'fixed', 'heuristic' or 'alpha', got '{}'", name);
}

}  // namespace speculant
