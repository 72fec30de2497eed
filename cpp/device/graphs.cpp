#include "device/graphs.h"

#ifdef SPECULANT_CUDA_GRAPHS
#include <ATen/core/CachingHostAllocator.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <fmt/format.h>

#include "errors.h"

namespace speculant {
namespace {

// Eager runs of a key before it is captured (the last one on the capture stream).
constexpr int64_t kWarmup = 3;
// Keys captured per model at most (the rest stay eager): the widths a decoder uses are few, times the slot
// buckets a long sequence passes through (native_rows.h: 9 for a 4096-slot cache).
constexpr int64_t kMaxGraphs = 128;

}  // namespace

std::string CallKey::name() const {
  if (!what.empty()) return what;
  return fmt::format("the {}-token {}call over {} slots", width, tree ? "tree " : "", keys);
}

void GraphCache::clear() {
  entries_.clear();  // the graphs release their pool as they go
  pool_ = {0, 0};     // a fresh pool for later captures: a released one cannot be taken again
  captured_ = 0;
}

std::string GraphCache::failure() const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return failure_;
}

void GraphCache::set_failure(std::string why) {
  for (auto& [key, entry] : entries_) entry->replay = nullptr;  // every call of the model runs eagerly from now on
  captured_ = 0;
  std::lock_guard<std::mutex> lock(failure_mutex_);
  failure_ = std::move(why);
}

std::string GraphCache::moved(const std::vector<std::pair<std::string, const void*>>& before, CallKey key) const {
  const auto after = state_();
  for (size_t i = 0; i < before.size() && i < after.size(); ++i) {
    if (before[i].second != after[i].second) {
      return fmt::format("{} rebinds {} to a new tensor instead of writing into it in place; a CUDA "
                         "graph replays into the memory it captured, so the cache must be written in place "
                         "(model.h)", key.name(), before[i].first);
    }
  }
  if (after.size() != before.size()) {
    return fmt::format("{} changes the module's tensors ({} before, {} after); a CUDA graph replays into "
                       "the memory it captured, so the cache must be written in place (model.h)", key.name(),
                       before.size(), after.size());
  }
  return "";
}

at::Tensor GraphCache::run(CallKey key, const std::vector<at::Tensor>& inputs, const Call& call) {
  std::unique_ptr<Entry>& slot = entries_[key];
  if (!slot) {
    slot = std::make_unique<Entry>();
    const at::Device device = inputs.front().device();  // graphs.h: later inputs may be on the host
    for (const at::Tensor& input : inputs) {
      slot->inputs.push_back(at::empty(input.sizes(), at::TensorOptions().dtype(input.scalar_type()).device(device)));
    }
  }
  Entry& entry = *slot;
  for (size_t i = 0; i < inputs.size(); ++i) entry.inputs[i].copy_(inputs[i], /*non_blocking=*/true);
  if (entry.replay) {
    entry.replay();
    return entry.output.clone();
  }
  ++entry.runs;
  const bool eager = !capture_ || !failure().empty();
  if (!eager && entry.runs >= kWarmup && captured() < kMaxGraphs) return warm_and_capture(key, entry, call);
  if (entry.runs > kWarmup || !state_ || (capture_ && !failure().empty())) return call(entry.inputs);
  // The key's first runs: the cache must stay where it is.
  const auto before = state_();
  at::Tensor out = call(entry.inputs);
  std::string why = moved(before, key);
  if (!why.empty()) {
    require(capture_, "{}", why);
    set_failure(std::move(why));
  }
  return out;
}

#ifdef SPECULANT_CUDA_GRAPHS

namespace {

// Ends a capture that failed. Before torch 2.15 (pytorch#180395) a capture_end that throws leaves the device
// and pinned-host allocators routing this stream's allocations to the graph's pool, and the pool referenced:
// end both here. A torch that did so itself says so by throwing, and its graph's destructor releases the pool.
void abandon(at::cuda::CUDAGraph& graph, c10::DeviceIndex device, c10::MempoolId_t pool) {
  try {
    graph.capture_end();
    return;  // ended cleanly (the failure came from the call): the graph releases its pool
  } catch (...) {
  }
  try {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool);
  } catch (...) {
    return;
  }
  bool host = true;
  try {
    at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(pool);
  } catch (...) {
    host = false;  // this torch does not route pinned allocations during captures
  }
  c10::cuda::CUDACachingAllocator::releasePool(device, pool);
  if (host) at::getHostAllocator(at::kCUDA)->release_pool(pool);
}

}  // namespace

at::Tensor GraphCache::warm_and_capture(CallKey key, Entry& entry, const Call& call) {
  const c10::DeviceIndex device = entry.inputs.front().device().index();
  if (!stream_) stream_ = c10::cuda::getStreamFromPool(false, device).unwrap();
  if (pool_ == c10::MempoolId_t{0, 0}) pool_ = at::cuda::graph_pool_handle();
  const c10::cuda::CUDAStream side(*stream_), current = c10::cuda::getCurrentCUDAStream(device);
  c10::cuda::CUDAEvent inputs_ready;
  inputs_ready.record(current);
  inputs_ready.block(side);
  at::Tensor out;
  std::string why;
  const auto before = state_ ? state_() : std::vector<std::pair<std::string, const void*>>{};
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    out = call(entry.inputs);  // the last warm-up: a real call, whose errors are the model's
    auto graph = std::make_shared<at::cuda::CUDAGraph>();
    try {
      // records, runs nothing: `out` is this call's result
      graph->capture_begin(pool_, cudaStreamCaptureModeThreadLocal);
      at::Tensor output;
      try {
        output = call(entry.inputs);
      } catch (...) {
        abandon(*graph, device, pool_);
        throw;
      }
      try {
        graph->capture_end();
      } catch (...) {
        abandon(*graph, device, pool_);
        throw;
      }
      why = state_ ? moved(before, key) : "";
      if (why.empty()) {
        entry.output = output;
        entry.replay = [graph] { graph->replay(); };
        ++captured_;
      }
    } catch (const c10::Error& error) {
      why = error.what_without_backtrace();
    } catch (const std::exception& error) {
      why = error.what();
    }
  }
  c10::cuda::CUDAEvent done;
  done.record(side);
  done.block(current);
  out.record_stream(current);  // made on the capture stream, used on the caller's
  if (!why.empty()) set_failure(fmt::format("capturing {} failed: {}", key.name(), why));
  return out;
}

std::string graphs_obstacle() { return ""; }

#else

at::Tensor GraphCache::warm_and_capture(CallKey key, Entry& entry, const Call& call) {
  set_failure(fmt::format("capturing {}: {}", key.name(), graphs_obstacle()));
  return call(entry.inputs);
}

std::string graphs_obstacle() {
  return "this build of speculant was compiled against a torch without CUDA, so it has no CUDA graphs";
}

#endif

}  // namespace speculant
