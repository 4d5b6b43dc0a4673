// The CPU kernels' threads: OpenMP's thread team (libgomp keeps its threads between parallel
// regions, spinning briefly before they sleep, so a step's many short regions do not pay a thread
// start each), and the number of physical cores that --threads defaults to.

#ifndef LMSERVE_KERNELS_CPU_PARALLEL_H_
#define LMSERVE_KERNELS_CPU_PARALLEL_H_

#include <cstdint>

#include "absl/functional/function_ref.h"

namespace lmserve::kernels {

// Runs fn(begin, end) over [0, n) split into at most `num_threads` contiguous ranges of nearly equal
// size, one per thread of the calling thread's team; the caller is one of them. Returns when all
// are done. n <= 0 runs nothing; one range runs on the caller without a parallel region.
void ParallelFor(int64_t n, int num_threads, absl::FunctionRef<void(int64_t, int64_t)> fn);

// Physical cores this process may run on (its affinity mask, SMT siblings counted once); at least 1.
int PhysicalCoreCount();

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_PARALLEL_H_
