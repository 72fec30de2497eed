// Prompt lookup (§3.6): the longest n-gram (max_ngram down to min_ngram) ending the sequence that occurred before
// in it proposes, with q the point mass, the tokens that followed its latest earlier occurrence. Chains only.
#pragma once

#include <ATen/ATen.h>

#include <memory>

#include "drafting/drafter.h"

namespace speculant {

std::shared_ptr<Drafter> prompt_lookup_drafter(int64_t vocab_size, int64_t min_ngram, int64_t max_ngram,
                                               const at::Device& device);

}  // namespace speculant
