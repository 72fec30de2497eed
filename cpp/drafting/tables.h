// Unigram / bigram tables over the vocabulary: log_unigram [V]; a bigram adds, per previous token a, the
// observed followers in CSR form (row_ptr [V + 1], followers, counts), smoothed with Witten-Bell
// interpolation: q(b | a) = (c(a, b) + T(a) u(b)) / (c(a) + T(a)), T(a) = distinct followers of a. The rows are
// built on the host, standardized and sampled on the device; a table gives its law after any context, so it
// drafts token trees too.
#pragma once

#include <ATen/ATen.h>

#include <memory>

#include "drafting/drafter.h"

namespace speculant {

std::shared_ptr<Drafter> unigram_drafter(const at::Tensor& unigram, const at::Device& device);
std::shared_ptr<Drafter> bigram_drafter(const at::Tensor& unigram, const at::Tensor& row_ptr,
                                        const at::Tensor& followers, const at::Tensor& counts,
                                        const at::Device& device);

}  // namespace speculant
