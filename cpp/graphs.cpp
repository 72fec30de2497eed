#include "graphs.h"

#ifdef SPECULANT_CUDA_GRAPHS
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <fmt/format.h>

namespace speculant {
namespace {

// Eager runs of a key before it is captured.
constexpr int64_t kWarmup = 3;
// Keys captured per model at most (the rest stay eager): the widths a decoder uses are few.
constexpr int64_t kMaxGraphs = 32;

}  // namespace

int64_t GraphCache::captured() const {
  int64_t count = 0;
  for (const auto& [key, entry] : entries_) count += static_cast<bool>(entry->replay);
  return count;
}

at::Tensor GraphCache::run(int64_t key, const std::vector<at::Tensor>& inputs, const Call& call) {
  std::unique_ptr<Entry>& slot = entries_[key];
  if (!slot) {
    slot = std::make_unique<Entry>();
    for (const at::Tensor& input : inputs) slot->inputs.push_back(at::empty_like(input, at::MemoryFormat::Contiguous));
  }
  Entry& entry = *slot;
  for (size_t i = 0; i < inputs.size(); ++i) entry.inputs[i].copy_(inputs[i], /*non_blocking=*/true);
  if (entry.replay) {
    entry.replay();
    return entry.output.clone();
  }
  at::Tensor out = call(entry.inputs);
  if (capture_ && failure_.empty() && ++entry.runs >= kWarmup && captured() < kMaxGraphs) capture(key, entry, call);
  return out;
}

#ifdef SPECULANT_CUDA_GRAPHS

void GraphCache::capture(int64_t key, Entry& entry, const Call& call) {
  const c10::DeviceIndex device = entry.inputs.front().device().index();
  try {
    // Capture records, it runs nothing: the eager run that preceded it computed this call's output. The
    // capture runs on a side stream once the device is idle, as torch.cuda.graph does.
    c10::cuda::device_synchronize();
    auto graph = std::make_shared<at::cuda::CUDAGraph>();
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device);
    at::Tensor output;
    {
      c10::cuda::CUDAStreamGuard on_side(side);
      graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      try {
        output = call(entry.inputs);
      } catch (...) {
        try {
          graph->capture_end();
        } catch (...) {
        }
        throw;
      }
      graph->capture_end();
    }
    c10::cuda::device_synchronize();
    entry.output = output;
    entry.replay = [graph] { graph->replay(); };
  } catch (const c10::Error& error) {
    failure_ = fmt::format("capturing the {}-token call failed: {}", key, error.what_without_backtrace());
  } catch (const std::exception& error) {
    failure_ = fmt::format("capturing the {}-token call failed: {}", key, error.what());
  }
  if (!failure_.empty()) {  // the model's calls all run eagerly from now on
    for (auto& [other, e] : entries_) e->replay = nullptr;
  }
}

std::string graphs_obstacle() { return ""; }

#else

void GraphCache::capture(int64_t key, Entry&, const Call&) {
  failure_ = fmt::format("capturing the {}-token call: this build of speculant has no CUDA graphs ({})", key,
                         graphs_obstacle());
}

std::string graphs_obstacle() {
  return "this build of speculant was compiled against a torch without CUDA, so it has no CUDA graphs";
}

#endif

}  // namespace speculant
