#include "math/streams.h"

#include <mutex>

#include "math/sampling.h"

namespace speculant {
namespace {

uint64_t mix(uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

void reseed(at::Generator& generator, uint64_t key) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_current_seed(key);
}

}  // namespace

uint64_t stream_key(uint64_t seed, Stream role, uint64_t step) {
  return mix(mix(mix(seed) ^ static_cast<uint64_t>(role)) ^ step);
}

Streams::Streams(const at::Device& device, uint64_t seed)
    : draft(make_generator(device, stream_key(seed, Stream::draft, 0))),
      coins(make_generator(device, stream_key(seed, Stream::coins, 0))),
      correction(make_generator(device, stream_key(seed, Stream::correction, 0))),
      seed(seed) {}

void Streams::start(uint64_t step) {
  reseed(draft, stream_key(seed, Stream::draft, step));
  reseed(coins, stream_key(seed, Stream::coins, step));
  reseed(correction, stream_key(seed, Stream::correction, step));
}

}  // namespace speculant
