#include "engine/runner/weight_loader.h"

#include <vector>

#include "common/status.h"
#include "kernels/cpu/dequant.h"

namespace lmserve::engine {

absl::Status LoadWeights(const WeightPlan& plan, const Checkpoint& checkpoint, LoadFormat format,
                         WeightSink& sink) {
  for (const WeightSpec& spec : plan.specs()) {
    int64_t first_row = 0;
    for (const WeightPart& part : spec.parts) {
      if (format == LoadFormat::kDummy) {
        LMSERVE_RETURN_IF_ERROR(sink.StoreDummy(spec, first_row, part));
      } else {
        LMSERVE_ASSIGN_OR_RETURN(const TensorView* tensor,
                                 checkpoint.Get(part.name, spec.PartShape(part)));
        LMSERVE_RETURN_IF_ERROR(CheckTensorBytes(*tensor));
        if (spec.offset == 0) {
          LMSERVE_RETURN_IF_ERROR(sink.Store(spec, first_row, *tensor));
        } else {  // Gemma's norms: the offset added in fp32, stored from there
          std::vector<float> values(static_cast<size_t>(tensor->NumElements()));
          kernels::DequantizeToF32(tensor->dtype, tensor->data, values.data(),
                                   tensor->NumElements());
          for (float& v : values) v += spec.offset;
          TensorView shifted = *tensor;
          shifted.dtype = kernels::DType::kF32;
          shifted.data = reinterpret_cast<const std::byte*>(values.data());
          shifted.num_bytes = static_cast<int64_t>(values.size() * sizeof(float));
          LMSERVE_RETURN_IF_ERROR(sink.Store(spec, first_row, shifted));
        }
      }
      first_row += part.rows;
    }
  }
  return absl::OkStatus();
}

}  // namespace lmserve::engine
