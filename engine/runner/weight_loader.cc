#include "engine/runner/weight_loader.h"

#include "common/status.h"

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
        LMSERVE_RETURN_IF_ERROR(sink.Store(spec, first_row, *tensor));
      }
      first_row += part.rows;
    }
  }
  return absl::OkStatus();
}

}  // namespace lmserve::engine
