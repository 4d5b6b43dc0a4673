// Communicators over NCCL between the GPUs of this process (tensor parallelism, one rank a GPU).
//
// NCCL is loaded at run time, as vLLM loads it: the binary has no link-time dependency on it, so
// one build serves machines with and without it, and only --tensor-parallel-size > 1 needs it.
// The library is $LMSERVE_NCCL_LIBRARY when set, otherwise libnccl.so.2 from the loader's search
// path (LD_LIBRARY_PATH; PyPI's nvidia-nccl-cu13 wheel ships it under nvidia/nccl/lib, and a
// PyTorch install has it there). The few entry points used are declared here with NCCL's stable
// C ABI (nccl.h of NCCL 2.x). NVLink multicast (NVLS) stays off and connections are made at
// initialization (NCCL_NVLS_ENABLE=0, NCCL_RUNTIME_CONNECT=0) unless the environment says
// otherwise.

#ifndef LMSERVE_ENGINE_RUNNER_CUDA_NCCL_COMMUNICATOR_H_
#define LMSERVE_ENGINE_RUNNER_CUDA_NCCL_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runner/communicator.h"

namespace lmserve::engine::cuda {

// One communicator per GPU first_device .. first_device + size - 1 (index = rank), from one
// ncclCommInitAll. Collectives are enqueued on the stream the caller passes (a cudaStream_t of the
// rank's device) and may be captured in CUDA graphs. All-reduces of at most `peer_max_bytes`
// (capped at kernels::cuda::kPeerAllReduceMaxBytes; 0: none) take the peer-to-peer kernel
// (kernels/cuda/allreduce.h) where every pair of the GPUs has peer access, NCCL otherwise.
// Errors: NCCL not found, fewer devices.
absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateNcclCommunicators(
    int32_t first_device, int32_t size, int64_t peer_max_bytes = int64_t{1} << 62);

}  // namespace lmserve::engine::cuda

#endif  // LMSERVE_ENGINE_RUNNER_CUDA_NCCL_COMMUNICATOR_H_
