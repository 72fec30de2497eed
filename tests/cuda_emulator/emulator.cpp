// The CUDA emulator's runtime (cuda_emulator.h): a grid's blocks run one after another, each on one OS thread
// per CUDA thread; __syncthreads waits on the block's mutex and condition variable, a warp's shuffles on the
// warp's, which ThreadSanitizer sees as the synchronisation they are.
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda_emulator.h"

namespace speculant::emulator {
namespace {

constexpr auto kPatience = std::chrono::seconds(120);  // a barrier not reached by then is a deadlock

struct Trap {};

// A barrier over `expected` threads that have not returned from the kernel; `site` is where the first arrival
// of the current round waits (two __syncthreads sites in one round are a divergence bug).
struct Barrier {
  int expected = 0, arrived = 0;
  long round = 0;
  std::string site;
  std::condition_variable changed;  // the round is over
};

struct Warp {
  std::mutex mutex;
  Barrier barrier;
  int lanes = 0;  // the warp's threads (32 but in a block's last, partial warp)
  unsigned char values[32][8] = {};
};

struct Block {
  std::mutex mutex;
  Barrier barrier;
  std::vector<Warp> warps;
  std::string trap;
};

Block* block_of_launch = nullptr;  // the running launch's block state, shared by its threads
std::string last_trap;
cudaError_t last_error = cudaSuccess;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "cuda emulator: %s (block %u,%u,%u thread %u,%u,%u)\n", what.c_str(), blockIdx.x,
               blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z);
  std::fflush(stderr);
  std::abort();
}

int linear_thread() {
  return static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
}

// Waits, holding `lock`, until every expected thread has arrived at `b`; the last one to arrive wakes the rest.
void arrive_and_wait(std::unique_lock<std::mutex>& lock, Barrier& b, const std::string& site) {
  if (b.arrived == 0) b.site = site;
  else if (b.site != site) fail("threads wait at two barriers at once: " + b.site + " and " + site);
  const long round = b.round;
  if (++b.arrived == b.expected) {
    b.arrived = 0, ++b.round;
    b.changed.notify_all();
    return;
  }
  if (!b.changed.wait_for(lock, kPatience, [&] { return b.round != round; }))
    fail("deadlock: " + std::to_string(b.expected - b.arrived) + " threads never reached " + site);
}

// A thread returned from the kernel: the barriers it would have joined no longer wait for it.
void leave(Block& block) {
  Warp& warp = block.warps[linear_thread() / 32];
  {
    std::lock_guard lock(warp.mutex);
    if (warp.barrier.arrived > 0) fail("a lane returned while its warp waits in a full-mask shuffle");
    --warp.barrier.expected;
  }
  std::lock_guard lock(block.mutex);
  Barrier& b = block.barrier;
  if (--b.expected > 0 && b.arrived == b.expected) {
    b.arrived = 0, ++b.round;
    b.changed.notify_all();
  }
}

// Before each block: every thread of the launch expected at every barrier again.
struct Reset {
  Block* block;
  int threads;
  void operator()() const noexcept {
    block->barrier.expected = threads;
    for (size_t w = 0; w < block->warps.size(); ++w)
      block->warps[w].lanes = block->warps[w].barrier.expected = std::min(32, threads - 32 * static_cast<int>(w));
  }
};
using BlockDone = std::barrier<Reset>;

void run_thread(int index, dim3 grid, dim3 block_shape, const std::function<void()>& kernel, Block& block,
                BlockDone& block_done) {
  threadIdx = uint3{index % block_shape.x, index / block_shape.x % block_shape.y,
                    index / (block_shape.x * block_shape.y)};
  blockDim = block_shape, gridDim = grid;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = uint3{x, y, z};
        try {
          kernel();
        } catch (const Trap&) {
          std::lock_guard lock(block.mutex);
          if (block.trap.empty())
            block.trap = "__trap() in block " + std::to_string(x) + "," + std::to_string(y) + "," +
                         std::to_string(z) + " thread " + std::to_string(index);
        }
        leave(block);
        block_done.arrive_and_wait();  // every thread has left this block: the next starts with all of them
      }
}

}  // namespace

int run(dim3 grid, dim3 shape, const std::function<void()>& kernel) {
  const long threads = static_cast<long>(shape.x) * shape.y * shape.z;
  if (threads == 0 || threads > 1024 || shape.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
      grid.y > 65535 || grid.z > 65535) {
    last_error = cudaErrorInvalidConfiguration;
    return static_cast<int>(last_error);
  }
  Block block;
  block.warps = std::vector<Warp>((threads + 31) / 32);
  const Reset reset{&block, static_cast<int>(threads)};
  reset();
  BlockDone block_done(threads, reset);
  block_of_launch = &block;
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i)
    pool.emplace_back(run_thread, i, grid, shape, std::cref(kernel), std::ref(block), std::ref(block_done));
  for (auto& thread : pool) thread.join();
  block_of_launch = nullptr;
  last_trap = block.trap;
  return 0;
}

const char* trapped() { return last_trap.c_str(); }

void sync_block(const std::source_location& where) {
  Block& block = *block_of_launch;
  std::unique_lock lock(block.mutex);
  arrive_and_wait(lock, block.barrier, std::string("__syncthreads at ") + where.file_name() + ":" +
                                           std::to_string(where.line()) + ":" + std::to_string(where.column()));
}

void exchange_in_warp(unsigned mask, void* value, int bytes, int lane_mask) {
  Block& block = *block_of_launch;
  const int thread = linear_thread(), lane = thread % 32;
  Warp& warp = block.warps[thread / 32];
  if (mask != (warp.lanes == 32 ? 0xffffffffu : (1u << warp.lanes) - 1))
    fail("a shuffle's mask must name every lane of the warp here, got " + std::to_string(mask));
  std::unique_lock lock(warp.mutex);
  if (warp.barrier.expected != warp.lanes) fail("a full-mask shuffle after a lane of its warp returned");
  std::memcpy(warp.values[lane], value, bytes);
  arrive_and_wait(lock, warp.barrier, "a shuffle");  // every lane's value is in
  const int from = lane ^ lane_mask;
  if (from < warp.lanes) std::memcpy(value, warp.values[from], bytes);
  arrive_and_wait(lock, warp.barrier, "a shuffle's read");  // every lane has read before the next write
}

void trap() { throw Trap{}; }

}  // namespace speculant::emulator

// The launches' error since the last call (a launch whose configuration CUDA would refuse), as CUDA's runtime.
extern "C" cudaError_t cudaGetLastError() {
  const cudaError_t error = speculant::emulator::last_error;
  speculant::emulator::last_error = cudaSuccess;
  return error;
}
