#include "loop/interrupt.h"

namespace speculant {
namespace {
thread_local InterruptCheck current = nullptr;
}  // namespace

InterruptScope::InterruptScope(InterruptCheck check) : previous_(current) { current = check; }
InterruptScope::~InterruptScope() { current = previous_; }

void check_interrupt() {
  if (current) current();
}

}  // namespace speculant
