// Embedding lookup: row ids[t] of the table, for every token.

#ifndef LMSERVE_KERNELS_CPU_EMBEDDING_H_
#define LMSERVE_KERNELS_CPU_EMBEDDING_H_

#include <cstdint>

#include "absl/status/status.h"

namespace lmserve::kernels {

struct EmbeddingParams {
  const float* table = nullptr;  // [vocab_size, hidden_size], contiguous
  const int32_t* ids = nullptr;  // [num_tokens], each in [0, vocab_size)
  float* output = nullptr;       // [num_tokens, hidden_size], contiguous
  int64_t num_tokens = 0;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;

  // Checks the shape and every id.
  absl::Status Validate() const;
};

// REQUIRES: params.Validate().ok() (checked; aborts otherwise).
void EmbeddingGather(const EmbeddingParams& params);

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_EMBEDDING_H_
