// How many tokens to draft in each iteration. A policy sees only what earlier iterations produced, so the
// choice is independent of the current iteration's randomness and every policy keeps the output law exact.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace speculant {

// How gamma evolves within a generation; the decoder's gamma is the start (or the value).
struct GammaSchedule {
  std::string policy = "fixed";
  std::optional<int64_t> max_gamma;  // default 2 * gamma
  double cost = 0.0;                 // c, for the "alpha" policy
};

class GammaPolicy {
 public:
  virtual ~GammaPolicy() = default;
  virtual int64_t next() const = 0;  // gamma for the coming iteration, in [1, max_gamma()]
  // After an iteration that drafted `drafted` tokens and kept `accepted`; beta_sum sums Σ min(p, q) over the
  // `verified` positions up to the first rejection (Theorem 3.5).
  virtual void observe(int64_t drafted, int64_t accepted, double beta_sum, int64_t verified) = 0;
  virtual int64_t max_gamma() const = 0;
};

// "fixed": gamma every time.
// "heuristic": start at gamma; +2 after an iteration that kept every draft, -1 otherwise, within
//   [1, max_gamma] (transformers' "heuristic" schedule; its default since transformers 5 is "constant").
// "alpha": estimate alpha by an exponential moving average of beta (weight 0.1 per verified position, starting
//   from alpha0 = 0.5), then pick the gamma in [1, max_gamma] that maximizes Theorem 3.8's improvement
//   (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)) for the given cost coefficient c (§3.5).
// Validates the arguments as given; then `cap` (the most tokens one iteration can still draft in this
// generation) bounds gamma and max_gamma, so that a huge gamma never costs memory or time.
std::unique_ptr<GammaPolicy> make_gamma_policy(const std::string& name, int64_t gamma, int64_t max_gamma,
                                               double cost, int64_t cap);

// Theorem 3.8's walltime improvement factor and its maximizer over [1, max_gamma] (§3.5). The factor is a
// concave function of gamma over an affine one, hence unimodal: the scan stops at its first decrease.
double walltime_improvement(double alpha, int64_t gamma, double cost);
int64_t best_gamma(double alpha, double cost, int64_t max_gamma);

}  // namespace speculant
