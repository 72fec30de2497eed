// Host kernels for CPU tensors: the sampling math of a draft step and of a verification in a few passes over
// the vocabulary, with pointer loops instead of small tensor operations. On a CPU each ATen operation costs
// microseconds of dispatch and allocation, and the tensor formulation of one Algorithm 1 iteration runs about
// fifty of them (BENCHMARKS.md, "Engine overhead"); these kernels run one softmax and a few allocations.
//
// The laws are those of sampling.h and speculative.h, which the tensor path computes for accelerators. Tests
// check both paths against tests/support/reference.py (test_sampling.py, test_step.py).
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/DistributionsHelper.h>

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "math/sampling.h"
#include "math/tree.h"
#include "math/verdict.h"

namespace speculant::cpu {

// Whether t's math runs these host kernels: a CPU tensor, unless they are off, where it takes the tensor path that
// accelerators run. Tests and benchmarks turn them off process-wide (speculant.testing.tensor_path) to run the
// accelerators' sampling and verification code, all of it but the CUDA graphs, on a CPU.
bool runs_on_host(const at::Tensor& t);
bool runs_on_host(const at::Device& device);  // a tensor on `device`'s
bool set_host_kernels(bool on);  // returns the previous setting

// Whether a CPU tensor of raw row maxima holds no NaN and no +inf (read on the host; undefined: true).
bool all_finite(const at::Tensor& maxima);

// A source of independent uniforms in [0, 1): the decoder's generator, or given values in tests.
using Uniform = std::function<double()>;

// standardize() for CPU logits [n, V], same contract and working dtype. `finite` (if given) receives one flag
// per row: no NaN, no +inf, not entirely -inf (what row_maxima() being finite means). A row that fails comes
// out as NaN (callers reject it through its flag).
at::Tensor standardize(const at::Tensor& logits, const SamplingConfig& config, std::vector<uint8_t>* finite);

// One token from row `row` of a CPU probability matrix [n, V] (float32 or float64; rows need not be
// normalized): argmax (first on ties) when greedy, else inverse CDF with one uniform.
int64_t draw(const at::Tensor& probs, int64_t row, bool greedy, const Uniform& uniform);

// sample() for CPU probabilities: one token per row, one uniform per row from `generator`.
at::Tensor sample(const at::Tensor& probs, at::Generator& generator);

// Algorithm 1's verification for CPU tensors: target_logits [gamma + 1, V], q [gamma, V] the draft rows the
// tokens were drawn from, drafted [gamma] the draft tokens (host). The chain is the tree [1] * gamma, verified by
// verify_tree's walk in p's working dtype (float32 but for float64 logits) with A.5's lenience, which trees
// refuse; each node's test reads p and q themselves. The verdict (verdict.h) without its device token: n kept,
// t ~ residual(p_{n+1}, q_{n+1}) or p_{gamma+1} when all were kept (argmax if greedy), the betas of the verified
// positions, finite: every target row was (standardize's flags). Draws one r per draft token up to the first
// rejection from `coins`, then one uniform for t from `draw`; greedy draws none. Standardizes all gamma + 1 target rows
// (all are checked for finiteness) but evaluates beta and the residual only where Algorithm 1 reads them.
// config.block(): Sun et al.'s block verification instead (tree.h), the verdict's betas still the first
// min(n + 1, gamma) positions'; it draws one coin per position of r > 0 from the last down to the one it stops at,
// then t's uniform from `draw`.
// `coins` gives the tests' uniforms, `draw` t's: two streams (streams.h), which may be one source in tests.
Verdict verify(const at::Tensor& target_logits, const at::Tensor& q, const int64_t* drafted,
               const SamplingConfig& config, const Uniform& coins, const Uniform& draw);

// draw_children() (tree.h) for a CPU row q [V], sampled (not greedy): k tokens, each by inverse CDF with one
// uniform from what is left of q (without replacement: the tokens drawn before it removed); once nothing is
// left, token 0 (verify_tree never accepts a token its q_j gives no mass). sibling (may be undefined; independent
// draws only): [V], the law of children 1 .. k - 1.
at::Tensor draw_children(const at::Tensor& q, int64_t k, Siblings siblings, const Uniform& uniform,
                         const at::Tensor& sibling = at::Tensor());

// Multi-draft verification of a token tree for CPU tensors (tree.h's rule and arguments; tokens: the nodes'
// tokens, host), in float64. Standardizes every target row (all are checked for finiteness) but walks down from
// the root evaluating only the nodes it reaches: at each, its children's tests in rank order, one uniform of `coins`
// each until one is accepted (greedy: none), and at the node where it stops one uniform of `draw` for t from the last
// residual (greedy: the argmax of p there). verification = block: traversal verification (tree.h), its coins in
// post-order. verdict.token is left undefined (the caller makes it).
Verdict verify_tree(const Tree& tree, const at::Tensor& target_logits, const at::Tensor& q, const int64_t* tokens,
                        const SamplingConfig& config, Siblings siblings, const Uniform& coins, const Uniform& draw,
                        const at::Tensor& sibling_q = at::Tensor());

// top_tokens() (tree.h) for CPU scores [..., V]: each row's k highest, the first index on ties (NaN above all, as
// a descending sort puts it), by a partial sort of the row's indices: O(V log k) where a full sort is O(V log V).
at::Tensor top_tokens(const at::Tensor& q, int64_t k);

// int64 [1] holding `token` on the CPU (a verdict's or a draw's device token there), without a tensor operation.
at::Tensor token_tensor(int64_t token);

// Uniforms from a CPU generator, holding the generator's lock while it lives.
class GeneratorUniform {
 public:
  explicit GeneratorUniform(at::Generator& generator)
      : generator_(at::check_generator<at::CPUGeneratorImpl>(generator)), lock_(generator_->mutex_) {}
  double operator()() { return distribution_(generator_); }

 private:
  at::CPUGeneratorImpl* generator_;
  std::lock_guard<std::mutex> lock_;
  at::uniform_real_distribution<double> distribution_{0.0, 1.0};
};

}  // namespace speculant::cpu
