// CUDA graphs of a model's fixed-shape calls (rows.h: Shapes::graphed).
//
// A fixed-shape call's shapes depend on a small key alone (CallKey: the call's width, whether it is a tree call,
// its mask an input too, and the cache slots it reads). After a few eager runs of a key (warm-up: the
// TorchScript executor profiles and optimizes its graph in its first runs; the last run is on the capture
// stream, so that per-stream set-up such as cuBLAS workspaces happens outside the capture) the call is captured
// once, with its inputs in static buffers. Later calls of that key copy their inputs into the buffers and replay
// the graph, one launch instead of one per operation, and return a copy of the graph's output (the next replay
// overwrites it). The graphs of one cache share one memory pool: replays run one at a time on the caller's
// stream and their outputs are copied at once. A capture that fails leaves every call of the model uncaptured,
// and failure() says why. Shapes::fixed runs the same calls through the same buffers without capturing, on any
// device.
//
// A graph replays into the memory it captured, so a call must write its cache in place (model.h): a module
// that rebinds its cache to a new tensor would replay into the old one and return wrong logits. The backend's
// `state` lists the tensors a call must leave where they are; each key's first runs and its capture compare
// their addresses before and after. A rebinding is a failure (every call eager, as above) with graphs, and a
// ValueError with fixed shapes, which exist to check on any device what a graph would replay.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace speculant {

// What a fixed-shape call's shapes depend on: its width (tokens per row), whether it is a tree call (its mask an
// input too), and the cache slots it reads (native_rows.h: a power-of-two bucket).
struct CallKey {
  int64_t width = 0;
  bool tree = false;
  int64_t keys = 0;
  // a call that is no model's (tree_verification.cpp): what it is and every shape it depends on; names it
  std::string what;
  auto operator<=>(const CallKey&) const = default;
  // "the 3-token call over 64 slots", "the 3-token tree call over 64 slots", or `what`
  std::string name() const;
};

class GraphCache {
 public:
  using Call = std::function<at::Tensor(const std::vector<at::Tensor>&)>;
  // (name, data pointer) of each tensor the calls must write in place, the name as messages should say it.
  using State = std::function<std::vector<std::pair<std::string, const void*>>()>;

  // capture: whether to capture (CUDA tensors only) or only to run through the static buffers.
  GraphCache(bool capture, State state) : capture_(capture), state_(std::move(state)) {}

  // Drops every graph and buffer: the backend calls it when it reallocates what the graphs write (its cache).
  void clear();
  // call(inputs) for the key `key` (inputs of the same shapes and dtypes at every call of a key). The buffers are on
  // the first input's device; a later input may be a host tensor (upload.h's host_buffer, pinned for CUDA), copied
  // straight into its buffer: one copy where an upload and then a copy into the buffer would be two.
  at::Tensor run(CallKey key, const std::vector<at::Tensor>& inputs, const Call& call);

  // Safe to read while another thread runs the model.
  std::string failure() const;
  int64_t captured() const { return captured_.load(); }

 private:
  struct Entry {
    std::vector<at::Tensor> inputs;  // the static buffers the calls read
    at::Tensor output;               // the graph's output, rewritten by every replay
    std::function<void()> replay;    // owns the graph; empty while the key runs eagerly
    int64_t runs = 0;
  };
  // The key's last warm-up run on the capture stream (its output returned), then its capture.
  at::Tensor warm_and_capture(CallKey key, Entry& entry, const Call& call);
  // The first tensor of `before` (state_()) that a call of `key` moved, as a message; "" if none moved.
  std::string moved(const std::vector<std::pair<std::string, const void*>>& before, CallKey key) const;
  void set_failure(std::string why);

  bool capture_;
  State state_;
  std::map<CallKey, std::unique_ptr<Entry>> entries_;
  std::optional<c10::Stream> stream_;              // the capture stream, made at the first capture
  c10::MempoolId_t pool_{0, 0};                    // the graphs' memory pool ({0, 0}: none yet)
  std::atomic<int64_t> captured_{0};
  mutable std::mutex failure_mutex_;
  std::string failure_;
};

// Why this build cannot capture CUDA graphs (its torch has no CUDA), or "".
std::string graphs_obstacle();

}  // namespace speculant
