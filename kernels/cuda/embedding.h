// Embedding gather on the GPU (CPU twin: kernels/cpu/embedding.h): output[t] = table[ids[t]].
// bf16, fp16 or fp32 table and output; a 16-bit table may also be gathered into fp32 rows (the
// CUDA runner's fp32 residual stream).

#ifndef LMSERVE_KERNELS_CUDA_EMBEDDING_H_
#define LMSERVE_KERNELS_CUDA_EMBEDDING_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

struct EmbeddingParams {
  const void* table = nullptr;   // [vocab_size, hidden_size], contiguous; device
  const int32_t* ids = nullptr;  // [num_tokens]; device. An id outside [0, vocab_size) cannot be
                                 // reported from the device: its row of the output is zeros.
  void* output = nullptr;        // [num_tokens, hidden_size], contiguous, output_dtype; device
  int64_t num_tokens = 0;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;     // multiple of 8
  DType dtype = DType::kBF16;  // of table (and output by default): kBF16, kF16 or kF32
  float scale = 1.0f;          // multiplies the rows (in fp32, rounded once); 1: copied as stored
  // Of output: dtype (nullopt means dtype) or kF32. fp32 rows of a 16-bit table are its values
  // times scale, unrounded.
  std::optional<DType> output_dtype = std::nullopt;
  // The id of the table's first row (a tensor-parallel rank's slice of the vocabulary): token t
  // gets row ids[t] - first_id, zeros where that is outside [0, vocab_size).
  int64_t first_id = 0;

  absl::Status Validate() const;  // shapes and pointers only: the ids live on the device
};

cudaError_t Launch(const EmbeddingParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_EMBEDDING_H_
