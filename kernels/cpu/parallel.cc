#include "kernels/cpu/parallel.h"

#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace lmserve::kernels {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

// How long a worker spins for the next loop before it sleeps.
constexpr auto kSpin = std::chrono::microseconds(100);

// One caller's workers. A loop is published as one 64-bit word, (generation << 16) | count, so
// that a worker reads which loop it is and how many threads share it in one load: worker w (from
// 1) takes share w of the loops whose count exceeds w, and skips the others.
class Team {
 public:
  ~Team() {
    stop_.store(true);
    Publish(state_.load() + (uint64_t{1} << 16));
    for (std::thread& t : workers_) t.join();
  }

  // chunk 0: share i of `count` nearly equal ranges to thread i; else ranges of `chunk` indexes
  // taken in order by whichever thread is free.
  void Run(int64_t n, int count, int64_t chunk, absl::FunctionRef<void(int64_t, int64_t)> fn) {
    while (static_cast<int>(workers_.size()) < count - 1) {
      const int index = static_cast<int>(workers_.size()) + 1;
      const uint64_t seen = state_.load();  // before this loop is published
      workers_.emplace_back([this, index, seen] { Work(index, seen); });
    }
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    next_.store(0, std::memory_order_relaxed);
    pending_.store(count - 1, std::memory_order_relaxed);
    Publish(((state_.load() >> 16) + 1) << 16 | static_cast<uint64_t>(count));
    Share(0, count);
    // The workers' shares are about as long as the caller's: spin, yielding if one is descheduled.
    for (int spins = 0; pending_.load(std::memory_order_acquire) > 0; ++spins) {
      if (spins < 4096) {
        CpuRelax();
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  void Publish(uint64_t state) {
    state_.store(state);  // seq_cst: ordered before the load of sleepers_ (Work's mirror image)
    if (sleepers_.load() > 0) state_.notify_all();
  }

  void Share(int index, int count) {
    if (chunk_ > 0) {
      for (;;) {
        const int64_t begin = next_.fetch_add(chunk_, std::memory_order_relaxed);
        if (begin >= n_) return;
        (*fn_)(begin, std::min(n_, begin + chunk_));
      }
    }
    const int64_t begin = n_ * index / count, end = n_ * (index + 1) / count;
    if (begin < end) (*fn_)(begin, end);
  }

  void Work(int index, uint64_t seen) {
    for (;;) {
      uint64_t state = state_.load(std::memory_order_acquire);
      const auto deadline = std::chrono::steady_clock::now() + kSpin;
      for (int spins = 0; state == seen; ++spins) {
        if ((spins & 255) == 255 && std::chrono::steady_clock::now() > deadline) {
          sleepers_.fetch_add(1);
          state_.wait(seen);
          sleepers_.fetch_sub(1);
        } else {
          CpuRelax();
        }
        state = state_.load(std::memory_order_acquire);
      }
      seen = state;
      if (stop_.load()) return;
      const int count = static_cast<int>(state & 0xFFFF);
      if (index < count) {
        Share(index, count);
        pending_.fetch_sub(1, std::memory_order_release);
      }
    }
  }

  std::vector<std::thread> workers_;
  std::atomic<uint64_t> state_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  // The loop being run; valid while pending_ > 0 for the workers that share it.
  absl::FunctionRef<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  std::atomic<int64_t> next_{0};  // chunk_ > 0: the first index not yet taken
};

void Run(int64_t n, int num_threads, int64_t chunk, absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  const int count =
      static_cast<int>(std::clamp<int64_t>(num_threads, 1, std::min<int64_t>(n, 0xFFFF)));
  if (count == 1) {
    if (chunk == 0) chunk = n;
    for (int64_t begin = 0; begin < n; begin += chunk) fn(begin, std::min(n, begin + chunk));
    return;
  }
  thread_local std::unique_ptr<Team> team;
  if (team == nullptr) team = std::make_unique<Team>();
  team->Run(n, count, chunk, fn);
}

}  // namespace

void ParallelFor(int64_t n, int num_threads, absl::FunctionRef<void(int64_t, int64_t)> fn) {
  Run(n, num_threads, 0, fn);
}

void ParallelForChunks(int64_t n, int num_threads, int64_t chunk,
                       absl::FunctionRef<void(int64_t, int64_t)> fn) {
  Run(n, num_threads, std::max<int64_t>(chunk, 1), fn);
}

int PhysicalCoreCount() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) {
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  // Each allowed CPU's core, named by the list of its SMT siblings (the same text for siblings).
  std::set<std::string> cores;
  int allowed = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mask)) continue;
    ++allowed;
    std::ifstream siblings("/sys/devices/system/cpu/cpu" + std::to_string(cpu) +
                           "/topology/thread_siblings_list");
    std::string list;
    if (!(siblings >> list)) list = "cpu" + std::to_string(cpu);  // no topology: count the CPU
    cores.insert(list);
  }
  return std::max(1, std::min(allowed, static_cast<int>(cores.size())));
}

}  // namespace lmserve::kernels
