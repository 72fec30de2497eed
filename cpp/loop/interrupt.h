// Ctrl-C between model calls. A generation runs with the GIL released, so Python cannot act on SIGINT until
// the call returns; the bindings therefore install a check (take the GIL, run Python's pending signal
// handlers, throw their exception) for the duration of a generate call made from Python's main thread, and
// the engine calls check_interrupt() before every model call. The exception (KeyboardInterrupt) unwinds the
// loop, releasing every lock; the next generate starts from fresh caches, so the decoder stays usable.
#pragma once

namespace speculant {

using InterruptCheck = void (*)();

// Installs `check` (may be null) on this thread while in scope.
class InterruptScope {
 public:
  explicit InterruptScope(InterruptCheck check);
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  InterruptCheck previous_;
};

// Runs this thread's installed check, if any (it throws to interrupt).
void check_interrupt();

}  // namespace speculant
