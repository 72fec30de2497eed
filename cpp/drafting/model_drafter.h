// A neural draft model M_q with its own cache, sampled with the same standardization as the target (§2.2). With
// `sibling` (token trees only; tree.h's sibling drafts) a second model runs beside it on the same tree nodes (down to
// the deepest level that branches), with its own cache: each node's first child comes from the draft's law, the
// later children from the sibling's.
#pragma once

#include <memory>

#include "drafting/drafter.h"
#include "models/model.h"

namespace speculant {

std::shared_ptr<Drafter> model_drafter(std::shared_ptr<Model> model, std::shared_ptr<Model> sibling = nullptr);

}  // namespace speculant
