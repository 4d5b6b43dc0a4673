// The CPU kernels' threads. Each thread that calls ParallelFor owns a team of worker threads,
// started at its first call and kept until it exits: a decode step runs a few hundred short
// parallel loops, so workers spin for a moment between loops (about 100 us) before they sleep on
// a futex, and a loop's start costs no thread creation and, while they spin, no system call. The
// caller works too, and the ranges of a loop go to whichever member is free, so a member that is
// descheduled or still waking does not hold the loop up by a whole share. Teams of different
// callers are independent (tensor-parallel ranks on CPU threads each have their own).

#ifndef LMSERVE_KERNELS_CPU_PARALLEL_H_
#define LMSERVE_KERNELS_CPU_PARALLEL_H_

#include <cstdint>

#include "absl/functional/function_ref.h"

namespace lmserve::kernels {

// Runs fn(begin, end) over [0, n) split into contiguous ranges of nearly equal size, at most
// min(n, 4 x num_threads) of them, on the caller and up to num_threads - 1 workers, and returns
// when all are done. The ranges depend only on n and num_threads, not on which thread runs each.
// n <= 0 runs nothing; num_threads <= 1 runs [0, n) on the caller alone.
void ParallelFor(int64_t n, int num_threads, absl::FunctionRef<void(int64_t, int64_t)> fn);

// Runs fn(begin, end) over [0, n) in ranges of `chunk` indexes (the last one shorter), taken in
// order by the caller and up to num_threads - 1 workers as each becomes free, and returns when all
// are done: a thread that starts late (descheduled on a busy machine) or runs slower takes fewer.
// Each range runs on one thread; which one is not fixed.
void ParallelForChunks(int64_t n, int num_threads, int64_t chunk,
                       absl::FunctionRef<void(int64_t, int64_t)> fn);

// The threads worth giving a loop of `work` units (multiply-adds, elements: the caller's measure)
// when a thread should get at least `min_work_per_thread` of them (a loop's start and end on the
// team cost a few microseconds): work / min_work_per_thread, between 1 and max(1, max_threads).
int ThreadsForWork(int64_t work, int64_t min_work_per_thread, int max_threads);

// Physical cores this process may run on (its affinity mask, SMT siblings counted once); at
// least 1.
int PhysicalCoreCount();

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_PARALLEL_H_
