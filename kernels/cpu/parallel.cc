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

// A loop is cut into up to this many ranges a thread, claimed one at a time by whichever thread is
// free: a member that is descheduled (a busy machine) or still waking from its futex delays the
// loop by at most the range it holds, not by its whole share, since the others take the rest.
constexpr int64_t kRangesPerThread = 4;

// One caller's workers. A loop is published as one 64-bit word, (generation << 16) | count, so
// that a worker reads which loop it is and how many threads may share it in one load: worker w
// (from 1) joins the loops whose count exceeds w. Its ranges are claimed from a second word,
// (generation << 40) | (ranges << 20) | next range, so that a worker that comes late to a loop
// can neither claim a range of the next one nor one past the end.
class Team {
 public:
  ~Team() {
    stop_.store(true);
    Publish(state_.load() + (uint64_t{1} << 16));
    for (std::thread& t : workers_) t.join();
  }

  // chunk 0: up to kRangesPerThread nearly equal ranges a thread; else ranges of `chunk` indexes.
  void Run(int64_t n, int count, int64_t chunk, absl::FunctionRef<void(int64_t, int64_t)> fn) {
    while (static_cast<int>(workers_.size()) < count - 1) {
      const int index = static_cast<int>(workers_.size()) + 1;
      const uint64_t seen = state_.load();  // before this loop is published
      workers_.emplace_back([this, index, seen] { Work(index, seen); });
    }
    const uint64_t generation = (state_.load() >> 16) + 1;
    const int64_t ranges =
        chunk > 0 ? (n + chunk - 1) / chunk : std::min(n, count * kRangesPerThread);
    fn_ = &fn;
    n_ = n;
    chunk_ = chunk;
    done_.store(0, std::memory_order_relaxed);
    claims_.store((generation & kGenerationMask) << 40 | static_cast<uint64_t>(ranges) << 20,
                  std::memory_order_release);
    Publish(generation << 16 | static_cast<uint64_t>(count));
    RunRanges(generation);
    // The others hold at most a range each: spin, yielding if one is descheduled.
    for (int spins = 0; done_.load(std::memory_order_acquire) < ranges; ++spins) {
      if (spins < 4096) {
        CpuRelax();
      } else {
        std::this_thread::yield();
      }
    }
  }

 private:
  static constexpr uint64_t kGenerationMask = (uint64_t{1} << 24) - 1;
  static constexpr uint64_t kFieldMask = (uint64_t{1} << 20) - 1;  // ranges (Run's callers bound them)

  void Publish(uint64_t state) {
    state_.store(state);  // seq_cst: ordered before the load of sleepers_ (Work's mirror image)
    if (sleepers_.load() > 0) state_.notify_all();
  }

  // Claims and runs ranges of the loop `generation` until none is left (or it has ended).
  void RunRanges(uint64_t generation) {
    uint64_t claim = claims_.load(std::memory_order_acquire);
    for (;;) {
      if ((claim >> 40) != (generation & kGenerationMask)) return;
      const uint64_t ranges = (claim >> 20) & kFieldMask, index = claim & kFieldMask;
      if (index >= ranges) return;
      if (!claims_.compare_exchange_weak(claim, claim + 1, std::memory_order_acq_rel,
                                         std::memory_order_acquire)) {
        continue;  // `claim` now holds the current word
      }
      // A claimed range keeps the loop (fn_, n_) alive until done_ counts it.
      const int64_t r = static_cast<int64_t>(ranges), i = static_cast<int64_t>(index);
      if (chunk_ > 0) {
        (*fn_)(i * chunk_, std::min(n_, (i + 1) * chunk_));
      } else {
        (*fn_)(n_ * i / r, n_ * (i + 1) / r);
      }
      done_.fetch_add(1, std::memory_order_release);
      claim = claims_.load(std::memory_order_acquire);
    }
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
      if (index < count) RunRanges(state >> 16);
    }
  }

  std::vector<std::thread> workers_;
  std::atomic<uint64_t> state_{0};
  std::atomic<uint64_t> claims_{0};
  std::atomic<int64_t> done_{0};  // ranges of the current loop finished
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  // The loop being run; valid while a range of it is claimed and not yet done.
  absl::FunctionRef<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
};

// Runs a loop on the calling thread's team (Team::Run's `chunk`).
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
  // At most 2^20 - 1 ranges (the claim word's field): larger chunks past that.
  chunk = std::max<int64_t>({chunk, 1, (n + 0xFFFFE) / 0xFFFFF});
  Run(n, num_threads, chunk, fn);
}

int ThreadsForWork(int64_t work, int64_t min_work_per_thread, int max_threads) {
  return static_cast<int>(std::clamp<int64_t>(work / std::max<int64_t>(min_work_per_thread, 1), 1,
                                              std::max(1, max_threads)));
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
