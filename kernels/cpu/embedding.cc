#include "kernels/cpu/embedding.h"

#include <cstring>

#include "common/strings.h"
#include "kernels/cpu/check.h"

namespace lmserve::kernels {

absl::Status EmbeddingParams::Validate() const {
  if (num_tokens < 0 || vocab_size <= 0 || hidden_size <= 0) {
    return absl::InvalidArgumentError(StrCat("Embedding: bad shape (tokens ", num_tokens,
                                             ", vocab ", vocab_size, ", hidden ", hidden_size,
                                             ")"));
  }
  if (num_tokens > 0 && (table == nullptr || ids == nullptr || output == nullptr)) {
    return absl::InvalidArgumentError("Embedding: null table, ids or output");
  }
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (ids[t] < 0 || ids[t] >= vocab_size) {
      return absl::InvalidArgumentError(
          StrCat("Embedding: token ", t, " has id ", ids[t], " outside [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

void EmbeddingGather(const EmbeddingParams& p) {
  CheckValid(p.Validate(), "EmbeddingGather");
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    std::memcpy(p.output + t * p.hidden_size, p.table + int64_t{p.ids[t]} * p.hidden_size,
                static_cast<size_t>(p.hidden_size) * sizeof(float));
  }
}

}  // namespace lmserve::kernels
