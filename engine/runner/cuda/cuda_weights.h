// The CUDA runner's weights: every tensor of the model's WeightPlan in one device allocation, in
// the runner's element type, each 256-byte aligned, in declaration order. GGUF-quantized and
// fp16/fp32/bf16 tensors are converted on the GPU (kernels/cuda/dequant.h, bit-exact with the
// CPU's conversion); dummy weights are drawn there (kernels/cuda/random_fill.h).

#ifndef LMSERVE_ENGINE_RUNNER_CUDA_CUDA_WEIGHTS_H_
#define LMSERVE_ENGINE_RUNNER_CUDA_CUDA_WEIGHTS_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/weight_plan.h"
#include "engine/runner/cuda/cuda_buffer.h"
#include "engine/runner/weight_loader.h"
#include "kernels/dtype.h"

namespace lmserve::engine::cuda {

class CudaWeights final : public WeightSink {
 public:
  // Allocates room for every tensor of `plan` (which must outlive this) in `dtype` (kBF16 or
  // kF32); loading goes to `stream`.
  static absl::StatusOr<CudaWeights> Allocate(const WeightPlan& plan, kernels::DType dtype,
                                              cudaStream_t stream);

  absl::Status Store(const WeightSpec& spec, int64_t first_row, const TensorView& tensor) override;
  absl::Status StoreDummy(const WeightSpec& spec, int64_t first_row,
                          const WeightPart& part) override;

  // The tensor's device address (a tied tensor's is its target's).
  const void* operator[](Weight weight) const {
    return buffer_.at(offsets_[plan_->Storage(weight).index]);
  }
  int64_t bytes() const { return buffer_.bytes(); }

 private:
  // Rows from `first_row` on of `spec`'s storage.
  void* Rows(const WeightSpec& spec, int64_t first_row) const;

  const WeightPlan* plan_ = nullptr;
  kernels::DType dtype_ = kernels::DType::kBF16;
  int64_t element_bytes_ = 2;
  cudaStream_t stream_ = nullptr;
  CudaBuffer buffer_;
  std::vector<int64_t> offsets_;  // by Weight::index; a tied tensor's is its target's
};

}  // namespace lmserve::engine::cuda

#endif  // LMSERVE_ENGINE_RUNNER_CUDA_CUDA_WEIGHTS_H_
