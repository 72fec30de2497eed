// A neural draft model M_q with its own cache, sampled with the same standardization as the target (§2.2). With
// `sibling` (token trees only; tree.h's sibling drafts) a second model runs beside it on the same tree nodes (down to
// the deepest level that branches), with its own cache: each node's first child comes from the draft's law, the
// later children from the sibling's.
//
// `stop_below` > 0 (chains only): the confidence stop. A row ends its proposal after a draft token to which its q gave
// less than `stop_below` (at temperature 0, where q is a point mass: the draft's softmax), so gamma is the most it
// drafts (transformers' assistant_confidence_threshold). The rule reads only the draft's own logits and draws: at each
// position either a draft x ~ q is tested by Algorithm 1 or, after the stop, the target's residual with q = 0 (p
// itself) is drawn, so the output law stays exactly the target's.
#pragma once

#include <memory>

#include "drafting/drafter.h"
#include "models/model.h"

namespace speculant {

std::shared_ptr<Drafter> model_drafter(std::shared_ptr<Model> model, std::shared_ptr<Model> sibling = nullptr,
                                       double stop_below = 0.0);

}  // namespace speculant
