// A row's random streams: the draft's draws, the verification's coins and the correction's draw (t), each from its
// own generator. A peer's block verification lost exactness by letting one stream serve all three (the draft's
// uniform reused as the acceptance coin correlates the coin with the token it tests); tree.h's proofs need the three
// independent. Each stream is reseeded at every iteration (`step`) from a key of (the row's seed, its role, the
// step), so a seeded run is reproducible on CPU and on accelerators, and what one role draws never shifts another's.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace speculant {

enum class Stream : uint64_t { draft = 1, coins = 2, correction = 3 };

// The seed of `role`'s stream at iteration `step` of a row seeded `seed`: splitmix64's finalizer over the three
// (distinct keys for distinct (seed, role, step) but with probability about 2^-64).
uint64_t stream_key(uint64_t seed, Stream role, uint64_t step);

struct Streams {
  Streams() = default;
  Streams(const at::Device& device, uint64_t seed);
  // Reseeds the three streams for iteration `step`.
  void start(uint64_t step);
  // A new seed (a hierarchy's level takes its outer row's draft stream's key for each proposal), from step 0.
  void reseat(uint64_t seed) { this->seed = seed; }

  at::Generator draft, coins, correction;
  uint64_t seed = 0;
};

}  // namespace speculant
