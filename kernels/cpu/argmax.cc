#include "kernels/cpu/argmax.h"

#include <limits>

#include "common/strings.h"
#include "kernels/cpu/check.h"

namespace lmserve::kernels {

absl::Status ArgmaxParams::Validate() const {
  if (num_rows < 0 || row_size <= 0 || row_size > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(StrCat("Argmax: bad shape [", num_rows, ", ", row_size, "]"));
  }
  if (num_rows > 0 && (input == nullptr || output == nullptr)) {
    return absl::InvalidArgumentError("Argmax: null input or output");
  }
  return absl::OkStatus();
}

void Argmax(const ArgmaxParams& p) {
  CheckValid(p.Validate(), "Argmax");
  for (int64_t r = 0; r < p.num_rows; ++r) {
    const float* row = p.input + r * p.row_size;
    int64_t best = 0;
    float best_value = row[0];
    for (int64_t i = 1; i < p.row_size; ++i) {
      // A number replaces a leading NaN; a NaN never replaces anything.
      if (row[i] > best_value || (best_value != best_value && row[i] == row[i])) {
        best = i;
        best_value = row[i];
      }
    }
    p.output[r] = static_cast<int32_t>(best);
  }
}

}  // namespace lmserve::kernels
