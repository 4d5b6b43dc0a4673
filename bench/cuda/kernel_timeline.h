// The kernels a stretch of GPU work runs, each with its start and end on the device's clock,
// from CUPTI's activity API (libcupti, loaded at run time: the benchmarks run where it is
// missing, without timelines). Kernels in CUDA graphs are recorded too, and with programmatic
// dependent launch a kernel's start can precede its predecessor's end: attribute a step's time
// by the gaps between consecutive ends (Summarize), not by durations.

#ifndef LMSERVE_BENCH_CUDA_KERNEL_TIMELINE_H_
#define LMSERVE_BENCH_CUDA_KERNEL_TIMELINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lmserve::bench {

struct KernelRecord {
  std::string name;  // demangled, without namespaces and template arguments
  uint64_t start_ns = 0, end_ns = 0;
};

class KernelTimeline {
 public:
  // Starts recording every kernel of the process. One timeline at a time.
  static absl::StatusOr<std::unique_ptr<KernelTimeline>> Start();
  ~KernelTimeline();
  KernelTimeline(const KernelTimeline&) = delete;
  KernelTimeline& operator=(const KernelTimeline&) = delete;

  // Stops recording (after the GPU work is done: synchronize first) and returns the kernels,
  // ordered by end.
  std::vector<KernelRecord> Stop();

 private:
  KernelTimeline() = default;
  bool stopped_ = false;
};

// Per kernel name: launches, the sum of durations, and the sum of the gaps between its end and
// the previous kernel's end (its share of the critical path; over a timeline, the gaps add up to
// the time from the first kernel's start to the last one's end).
struct KernelShare {
  std::string name;
  int count = 0;
  double busy_us = 0;
  double critical_us = 0;
};
std::vector<KernelShare> Summarize(const std::vector<KernelRecord>& records);

}  // namespace lmserve::bench

#endif  // LMSERVE_BENCH_CUDA_KERNEL_TIMELINE_H_
