// CUDA graphs of decode-only steps, one per batch bucket (1, 2, 4, 8, then every 8 up to
// max_num_seqs): a decode step replays the graph of the smallest bucket that holds it, its
// sequences padded to the bucket's size.

#ifndef LMSERVE_ENGINE_RUNNER_CUDA_DECODE_GRAPHS_H_
#define LMSERVE_ENGINE_RUNNER_CUDA_DECODE_GRAPHS_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>

#include "absl/status/status.h"

namespace lmserve::engine::cuda {

class DecodeGraphs {
 public:
  DecodeGraphs() = default;
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;
  ~DecodeGraphs();

  // Records the graph of bucket `batch_size`: runs `forward` once eagerly on `stream` (a warm-up,
  // so that nothing is allocated, loaded or timed while capturing), then captures a second run.
  // `forward` enqueues the whole step on `stream` and must do the same work each time.
  absl::Status Capture(int64_t batch_size, cudaStream_t stream,
                       const std::function<absl::Status()>& forward);
  // Uploads every graph to the device, so that no first replay pays for it.
  absl::Status Upload(cudaStream_t stream);

  // The bucket for a decode step of `num_seqs` sequences: its size, or 0 when none holds them.
  int64_t BucketFor(int64_t num_seqs) const;
  // Replays bucket `batch_size`'s graph on `stream`. REQUIRES: a captured bucket.
  absl::Status Replay(int64_t batch_size, cudaStream_t stream) const;

  int32_t size() const { return static_cast<int32_t>(graphs_.size()); }

 private:
  struct Graph {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
  };
  std::map<int64_t, Graph> graphs_;
};

}  // namespace lmserve::engine::cuda

#endif  // LMSERVE_ENGINE_RUNNER_CUDA_DECODE_GRAPHS_H_
