// Hierarchical drafts: the draft is itself a speculative decoder, its model M_q accelerated by an even faster
// drafter (the paper's conclusion; staged speculative decoding, Spector & Re 2023), to any depth.
//
// Each outer iteration asks the draft level for k tokens. The level runs Algorithm 1 on its own pair (target
// M_q, its drafter) until it has emitted exactly k tokens: each of its iterations drafts at most
// (tokens still wanted - 1), so it never overshoots, and any gamma chosen before an iteration keeps its law
// exact. It reports, as the q of each token, M_q's standardized distribution at that token's position (the row
// of its own verification logits there), standardized with the outer call's settings (lenience 1 at every
// level below the top). When the outer target keeps the first n tokens and appends t, the level cuts its
// sequence back to prefix + x_1 .. x_n, t (restart, in its model and in its drafter), recomputing nothing.
//
// Exactness. Algorithm 1 leaves the output law the target's for any draft law, provided each x_i is drawn
// from the q_i it reports given the prefix and x_1 .. x_{i-1} (Theorem 3.5's identity needs nothing else). The
// draft level's output is distributed exactly as M_q's own sampling (Algorithm 1's guarantee, one level down,
// by induction on the depth), so x_i given the prefix and x_1 .. x_{i-1} has law q_i = M_q's standardized
// distribution there, which is the row reported. Stopping at exactly k tokens is a stopping rule that looks at
// the number of tokens only, so the first k tokens keep their joint law. The outer verification's uniforms
// come from the same generator after the level's draws: they are independent of the drafts, as Algorithm 1
// requires. Lenience below 1 at a lower level would change that level's law away from M_q's (A.5), so the
// reported q would be wrong: it is refused.
#pragma once

#include <memory>

#include "drafting/drafter.h"
#include "drafting/gamma_policy.h"
#include "models/model.h"
#include "models/rows.h"

namespace speculant {

// model drafts with `drafter` (gamma tokens per iteration, as `schedule` evolves it; drafter_shapes: the
// drafter's model calls) and proposes the tokens it emits; Decoder::as_draft makes it from a validated pair.
std::shared_ptr<Drafter> hierarchy_drafter(std::shared_ptr<Model> model, std::shared_ptr<Drafter> drafter,
                                           int64_t gamma, const GammaSchedule& schedule, Shapes drafter_shapes);

}  // namespace speculant
