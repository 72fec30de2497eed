#include "device/device_clock.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <utility>

namespace speculant {

DeviceClock::DeviceClock(const at::Device& device, bool host) : device_(device), active_(device.is_cuda() && !host) {}

c10::Event DeviceClock::event() {
  if (spare_.empty()) return c10::Event(device_.type(), c10::EventFlag::BACKEND_DEFAULT);  // timing enabled
  c10::Event out = std::move(spare_.back());
  spare_.pop_back();
  return out;
}

void DeviceClock::begin() {
  if (!active_) return;
  const c10::Stream stream = c10::impl::getDeviceGuardImpl(device_.type())->getStream(device_);
  pending_.push_back(Phase{event(), event(), nullptr, {}});
  pending_.back().start.record(stream);
}

void DeviceClock::end(double Stats::*field, std::vector<size_t> rows) {
  if (!active_) return;
  Phase& phase = pending_.back();
  phase.stop.record(c10::impl::getDeviceGuardImpl(device_.type())->getStream(device_));
  phase.field = field;
  phase.rows = std::move(rows);
}

void DeviceClock::settle(const std::function<Stats&(size_t)>& stats) {
  if (!pending_.empty() && pending_.back().field == nullptr) pending_.pop_back();  // a phase that threw: no end
  if (pending_.empty()) return;
  pending_.back().stop.synchronize();  // the events complete in order on one stream
  for (Phase& phase : pending_) {
    const double seconds = phase.start.elapsedTime(phase.stop) / 1e3;  // milliseconds
    for (const size_t r : phase.rows) stats(r).*phase.field += seconds;
    spare_.push_back(std::move(phase.start));
    spare_.push_back(std::move(phase.stop));
  }
  pending_.clear();
}

}  // namespace speculant
