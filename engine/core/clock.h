// Time for the engine, injected so that timing tests are exact.

#ifndef LMSERVE_ENGINE_CORE_CLOCK_H_
#define LMSERVE_ENGINE_CORE_CLOCK_H_

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>

namespace lmserve::engine {

// A monotonic clock. Thread-safe: read by the engine thread and by callers of Engine::Submit.
class Clock {
 public:
  virtual ~Clock() = default;
  // Seconds since an arbitrary fixed origin; never decreases.
  virtual double NowSeconds() const = 0;
};

// std::chrono::steady_clock.
class SystemClock final : public Clock {
 public:
  double NowSeconds() const override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  // The process-wide instance (the engine's default).
  static const SystemClock* Get() {
    static const SystemClock clock;
    return &clock;
  }
};

// A clock that moves only when told to (tests). Thread-safe.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(double start_seconds = 0.0) : nanos_(ToNanos(start_seconds)) {}
  double NowSeconds() const override { return static_cast<double>(nanos_.load()) * 1e-9; }
  void AdvanceSeconds(double seconds) { nanos_.fetch_add(ToNanos(seconds)); }

 private:
  static int64_t ToNanos(double seconds) { return std::llround(seconds * 1e9); }
  std::atomic<int64_t> nanos_;
};

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_CORE_CLOCK_H_
