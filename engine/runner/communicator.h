// Collectives between the ranks of tensor parallelism (tensor_parallel_runner.h): the all-reduce
// after a row-parallel projection and the all-gather of the LM head's vocabulary slices.
//
// One Communicator per rank. Every rank calls the same collectives in the same order, each from its
// own thread; a call returns when this rank's part is done (the CUDA ones when it is enqueued on
// `stream`). Every rank ends with the same bits.

#ifndef LMSERVE_ENGINE_RUNNER_COMMUNICATOR_H_
#define LMSERVE_ENGINE_RUNNER_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::engine {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int32_t rank() const = 0;
  virtual int32_t size() const = 0;

  // data = the sum over the ranks of their `data` ([count] elements of `dtype`), in place. `data`
  // is host memory on the CPU, device memory of the rank's GPU with CUDA (then `stream` is the
  // cudaStream_t it is ordered on).
  virtual absl::Status AllReduceSum(void* data, int64_t count, kernels::DType dtype,
                                    void* stream) = 0;
  // recv = every rank's `send` ([count] elements each), in rank order: [size, count].
  virtual absl::Status AllGather(const void* send, void* recv, int64_t count, kernels::DType dtype,
                                 void* stream) = 0;
  // Returns once every rank's thread has called it (host threads only; nothing on a stream):
  // whether every rank passed `ok` (here and at every earlier barrier). A rank that fails still
  // calls it, so that the others learn of it instead of waiting, or running collectives, forever.
  virtual bool HostBarrier(bool ok) = 0;
};

// `size` communicators between threads of this process, one per rank (index = rank), for the CPU
// runner: fp32 host buffers; each rank sums the ranks' buffers in rank order, so all get the same
// bits. A collective blocks until every rank has called it.
std::vector<std::unique_ptr<Communicator>> CreateThreadCommunicators(int32_t size);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_RUNNER_COMMUNICATOR_H_
