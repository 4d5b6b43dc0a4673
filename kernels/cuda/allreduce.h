// The all-reduce of small messages between the GPUs of one process over peer-to-peer memory
// (NVLink): tensor parallelism's latency path, where NCCL's fixed cost dominates (a decode step of
// a large model runs two all-reduces a layer of a few KiB to a few hundred KiB each). NCCL takes
// larger messages (engine/runner/cuda/nccl_communicator.h chooses by size).
//
// One shot: every rank copies its message into its own staging buffer, signals every peer through
// flags in the peers' memory, waits for theirs, then reads every rank's staging buffer and sums
// them in fp32 in rank order (so every rank gets the same bits; the CPU twin is the same sum,
// engine/runner/communicator.h). The work is split among blocks by element range, and each block
// synchronizes only with the same block of its peers, which copied that range. The staging buffer
// has two halves used by turns (a call counter on the device picks the half, so CUDA graphs replay
// it): a rank writes a half at call c + 2 only after its call c + 1 ended, whose blocks each saw
// the same block of every peer start call c + 1, after the peer's call c (its reads of that half)
// ended; every call runs every block (kPeerAllReduceMaxBlocks), so one signal a call suffices. A peer that does not arrive
// within kPeerAllReduceTimeoutNs traps the kernel (a sticky error) rather than hang the GPU.

#ifndef LMSERVE_KERNELS_CUDA_ALLREDUCE_H_
#define LMSERVE_KERNELS_CUDA_ALLREDUCE_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

inline constexpr int kPeerAllReduceMaxRanks = 8;
inline constexpr int kPeerAllReduceMaxBlocks = 24;
// The largest message: each rank reads size x this.
inline constexpr int64_t kPeerAllReduceMaxBytes = int64_t{512} << 10;
inline constexpr int64_t kPeerAllReduceTimeoutNs = int64_t{10} * 1000 * 1000 * 1000;

// Per rank: the staging buffer (2 halves of kPeerAllReduceMaxBytes) and the flags
// ([kPeerAllReduceMaxBlocks][kPeerAllReduceMaxRanks] uint64, zeroed), on the rank's device,
// readable and writable by its peers; and the call counters ([kPeerAllReduceMaxBlocks] uint64,
// zeroed), its own.
inline constexpr int64_t kPeerAllReduceStagingBytes = 2 * kPeerAllReduceMaxBytes;
inline constexpr int64_t kPeerAllReduceFlagBytes =
    int64_t{kPeerAllReduceMaxBlocks} * kPeerAllReduceMaxRanks * 8;
inline constexpr int64_t kPeerAllReduceCounterBytes = int64_t{kPeerAllReduceMaxBlocks} * 8;

struct PeerAllReduceParams {
  void* data = nullptr;  // [count] of dtype on this rank's device: input and output
  int64_t count = 0;
  DType dtype = DType::kBF16;  // kBF16, kF16 or kF32
  int rank = 0;
  int size = 0;  // 2 .. kPeerAllReduceMaxRanks
  void* staging[kPeerAllReduceMaxRanks] = {};     // by rank
  uint64_t* flags[kPeerAllReduceMaxRanks] = {};   // by rank
  uint64_t* counters = nullptr;                   // this rank's

  absl::Status Validate() const;  // sizes, alignment (16 bytes), pointers
};

// Enqueues one all-reduce. Every rank must enqueue the same calls in the same order (sizes
// included): each waits for its peers. Capturable in CUDA graphs.
cudaError_t Launch(const PeerAllReduceParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_ALLREDUCE_H_
