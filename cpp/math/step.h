// A draft step of Algorithm 1 once the draft has run (standardize its logits and draw x_i ~ q_i), the call the
// drafters make; the verification is tree.h's verify_drafts. CPU tensors run the host kernels of cpu_kernels.h;
// accelerators run tensor operations (sampling.h). Both paths have the same laws and are tested against
// tests/support/reference.py.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "math/sampling.h"

namespace speculant {

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
// q and the witnesses as views, the tokens int64 [R] (one conversion). The same draws as draft_steps_as_tensors's.
bool draft_draws_fit(int64_t vocab);
at::Tensor packed_draft_draws(const at::Tensor& logits, const SamplingConfig& config, const at::Tensor& scaled);
DraftBatch unpack_draft_draws(const at::Tensor& packed);

// The tensor path on any device, CPU included (what accelerators run; exposed so that tests check it on CPU).
DraftDraw draft_step_as_tensors(const at::Tensor& logits, const SamplingConfig& config, at::Generator& generator);
std::vector<DraftDraw> draft_steps_as_tensors(const std::vector<at::Tensor>& logits, const SamplingConfig& config,
                                           const std::vector<at::Generator*>& generators,
                                           const std::vector<at::Tensor>& scaled = {}, DraftBatch* batch = nullptr);
}  // namespace speculant
