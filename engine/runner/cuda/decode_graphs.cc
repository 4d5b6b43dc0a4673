#include "engine/runner/cuda/decode_graphs.h"

#include "common/status.h"
#include "common/strings.h"
#include "engine/runner/cuda/cuda_buffer.h"

namespace lmserve::engine::cuda {

DecodeGraphs::~DecodeGraphs() {
  for (auto& [size, graph] : graphs_) {
    if (graph.exec != nullptr) cudaGraphExecDestroy(graph.exec);
    if (graph.graph != nullptr) cudaGraphDestroy(graph.graph);
  }
}

absl::Status DecodeGraphs::Capture(int64_t batch_size, cudaStream_t stream,
                                   const std::function<absl::Status()>& forward) {
  LMSERVE_RETURN_IF_ERROR(forward());  // warm-up
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream), "warming up a decode graph");
  Graph graph;
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                               "beginning a graph capture");
  const absl::Status recorded = forward();
  const cudaError_t end = cudaStreamEndCapture(stream, &graph.graph);
  if (!recorded.ok()) {
    if (graph.graph != nullptr) cudaGraphDestroy(graph.graph);
    return recorded;
  }
  LMSERVE_RETURN_IF_CUDA_ERROR(end, StrCat("capturing the decode graph of batch ", batch_size));
  if (const cudaError_t e = cudaGraphInstantiate(&graph.exec, graph.graph, 0); e != cudaSuccess) {
    cudaGraphDestroy(graph.graph);
    return CudaError(e, "instantiating a decode graph");
  }
  graphs_[batch_size] = graph;
  return absl::OkStatus();
}

absl::Status DecodeGraphs::Upload(cudaStream_t stream) {
  for (auto& [size, graph] : graphs_) {
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaGraphUpload(graph.exec, stream), "uploading a decode graph");
  }
  return absl::OkStatus();
}

int64_t DecodeGraphs::BucketFor(int64_t num_seqs) const {
  auto it = graphs_.lower_bound(num_seqs);
  return it != graphs_.end() ? it->first : 0;
}

absl::Status DecodeGraphs::Replay(int64_t batch_size, cudaStream_t stream) const {
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaGraphLaunch(graphs_.at(batch_size).exec, stream),
                               "replaying a decode graph");
  return absl::OkStatus();
}

}  // namespace lmserve::engine::cuda
