#include "kernels/cpu/parallel.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <thread>

namespace lmserve::kernels {

void ParallelFor(int64_t n, int num_threads, absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  const int threads = static_cast<int>(std::clamp<int64_t>(num_threads, 1, n));
  if (threads == 1) {
    fn(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t count = omp_get_num_threads();
    const int64_t i = omp_get_thread_num();
    const int64_t begin = n * i / count;
    const int64_t end = n * (i + 1) / count;
    if (begin < end) fn(begin, end);
  }
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
