// Phase times on an asynchronous device (a GPU): the device's time for a phase's work, not the host's time to
// queue it.
//
// The host queues a phase's kernels and moves on; it waits only where the algorithm reads a value (the accepted
// count). So the host's clock around a phase measures its launches: on an H100 that made the GPT-2 pair's c
// 0.60-0.70 where its calls, timed alone, gave 0.225 (issue 48). Here each phase is bracketed by two events on
// the device's current stream, and its time is the device's time between them, read once the host has waited
// anyway (settle(), at the next iteration and at the end). The span includes any wait of the device for the
// host inside the phase, which is part of what the phase costs. Inactive (the host's clock instead) on a CPU and
// when the caller synchronizes around phases itself (profile=True).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <cstddef>
#include <functional>
#include <vector>

#include "loop/stats.h"

namespace speculant {

class DeviceClock {
 public:
  // Active for a CUDA device unless `host` (the caller times with the host's clock).
  DeviceClock(const at::Device& device, bool host);

  bool active() const { return active_; }
  // The start of a phase (an event on the current stream).
  void begin();
  // The end of the phase begun last: its span will be added to `field` of every row in `rows`.
  void end(double Stats::*field, std::vector<size_t> rows);
  // Adds every ended phase's span to its rows' statistics (`stats(r)`: row r's), waiting for the last one.
  void settle(const std::function<Stats&(size_t)>& stats);

 private:
  struct Phase {
    c10::Event start, stop;
    double Stats::*field = nullptr;
    std::vector<size_t> rows;
  };
  c10::Event event();

  at::Device device_;
  bool active_;
  std::vector<Phase> pending_;
  std::vector<c10::Event> spare_;  // settled events, recorded again by later phases
};

}  // namespace speculant
