// The math of one Algorithm 1 iteration once the models have run, as the two calls the loops make: one draft
// step (standardize the draft's logits and draw x_i ~ q_i) and one verification (acceptance, n, the residual
// draw of t, and the beta values). CPU tensors run the host kernels of cpu_kernels.h; accelerators run tensor
// operations (sampling.h, speculative.h) with one small device-to-host read per verification of a batch. Both
// paths have the same laws and are tested against tests/reference.py.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "math/sampling.h"
#include "math/verdict.h"

namespace speculant {

class VerificationGraphs;  // verification_graphs.h

struct DraftDraw {
  at::Tensor q;        // [1, V] the standardized row the token was drawn from
  at::Tensor token;    // int64 [1] on the device
  at::Tensor maximum;  // [1] finite exactly when the raw row is (accelerators only): its maximum, or its mass
  bool finite = true;  // the raw row maximum was finite (checked on the host: CPU only)
};

// logits [1, V] on any device.
DraftDraw draft_step(const at::Tensor& logits, const SamplingConfig& config, at::Generator& generator);
// The draft steps of several rows at once: logits[r] [1, V], all on one device, row r drawing from *generators[r].
// CPU tensors run draft_step row by row; accelerators standardize every row in one pass and draw every token in
// one inverse-CDF pass over the rows' uniforms, each from its own generator: row r gets the draw it gets alone.
// `scaled` (accelerators; empty: drawn here): row r's uniform times kBelowOne, float64 [1, 1] on the device,
// drawn by the caller from *generators[r] (a drafter draws a row's uniforms for a whole proposal at once).
// `batch` (accelerators): receives the rows' draws as batch tensors, of which each DraftDraw's are views.
struct DraftBatch {
  at::Tensor q;        // [R, V]
  at::Tensor tokens;   // int64 [R]
  at::Tensor maximum;  // [R]
};
std::vector<DraftDraw> draft_steps(const std::vector<at::Tensor>& logits, const SamplingConfig& config,
                                   const std::vector<at::Generator*>& generators,
                                   const std::vector<at::Tensor>& scaled = {}, DraftBatch* batch = nullptr);

// The draft steps of the rows of one step call inside its graph (rows.h: extend_then): the rows' logits [R, V] and
// (sampled) their uniforms scaled as above [R, 1] -> q | token | witness packed [R, V + 2] in q's dtype, the graph's
// one output; the token ids are exact there where draft_draws_fit (V <= 2^24). unpack_draft_draws takes it apart:
// q and the witnesses as views, the tokens int64 [R] (one conversion). The same draws as draft_steps_generic's.
bool draft_draws_fit(int64_t vocab);
at::Tensor packed_draft_draws(const at::Tensor& logits, const SamplingConfig& config, const at::Tensor& scaled);
DraftBatch unpack_draft_draws(const at::Tensor& packed);

// One row's verification: target_logits [gamma + 1, V]; q [gamma, V] and drafted int64 [gamma] from the drafter
// (undefined or empty for gamma = 0); draft_maxima: the draft rows' maxima still to check (accelerators, may be
// undefined), draft_finite: those checked on the host.
struct VerifyInput {
  at::Tensor target_logits;
  at::Tensor q;
  at::Tensor drafted;
  at::Tensor draft_maxima;
  bool draft_finite = true;
};

// Every row of a batch at once, row i drawing from *generators[i]: each row is the tree [1] * gamma in its chain form
// (tree.h: TreeInput), verified by verify_trees, the one verifier of chains and trees. CPU tensors run the host walk
// row by row (nothing to read back). Accelerators run the tensor pass over all rows' nodes at once, read back in one
// transfer; the host tests each row's drafts against its coins and picks its t. Row i gets the verdict it gets
// alone: its generator gives the same draws in the same order (a coin per draft, then a uniform per position for t),
// and every operation is row-wise. With `graphs` the accelerators' pass runs through fixed-shape buffers keyed by
// the rows' drafts and the settings, a CUDA graph per key where they capture (verification_graphs.h).
std::vector<Verdict> verify_rows(const std::vector<VerifyInput>& rows, const SamplingConfig& config,
                                 const std::vector<at::Generator*>& generators, VerificationGraphs* graphs = nullptr);

// The tensor path on any device, CPU included (what accelerators run; exposed so that tests check it on CPU).
DraftDraw draft_step_generic(const at::Tensor& logits, const SamplingConfig& config, at::Generator& generator);
std::vector<DraftDraw> draft_steps_generic(const std::vector<at::Tensor>& logits, const SamplingConfig& config,
                                           const std::vector<at::Generator*>& generators,
                                           const std::vector<at::Tensor>& scaled = {}, DraftBatch* batch = nullptr);
std::vector<Verdict> verify_rows_generic(const std::vector<VerifyInput>& rows, const SamplingConfig& config,
                                         const std::vector<at::Generator*>& generators,
                                         VerificationGraphs* graphs = nullptr);

}  // namespace speculant
