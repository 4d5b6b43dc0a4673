#include "engine/runner/cuda/cuda_weights.h"

#include <algorithm>
#include <string>

#include "common/status.h"
#include "common/strings.h"
#include "engine/runner/dummy_weights.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/half.h"
#include "kernels/cuda/dequant.h"
#include "kernels/cuda/random_fill.h"

namespace lmserve::engine::cuda {
namespace {

namespace kc = kernels::cuda;
using kernels::DType;

int64_t Align256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

absl::StatusOr<CudaWeights> CudaWeights::Allocate(const WeightPlan& plan, DType dtype,
                                                  cudaStream_t stream) {
  CudaWeights weights;
  weights.plan_ = &plan;
  weights.dtype_ = dtype;
  weights.element_bytes_ = dtype == DType::kF32 ? 4 : 2;
  weights.stream_ = stream;
  weights.offsets_.assign(static_cast<size_t>(plan.size()), 0);
  int64_t total = 0;
  for (int32_t i = 0; i < plan.size(); ++i) {
    const WeightSpec& spec = plan.specs()[i];
    if (spec.tied_to.present()) continue;
    weights.offsets_[i] = total;
    total += Align256(spec.num_elements() * weights.element_bytes_);
  }
  for (int32_t i = 0; i < plan.size(); ++i) {
    const WeightSpec& spec = plan.specs()[i];
    if (spec.tied_to.present()) weights.offsets_[i] = weights.offsets_[spec.tied_to.index];
  }
  LMSERVE_ASSIGN_OR_RETURN(weights.buffer_, CudaBuffer::Device(total, "the weights"));
  return weights;
}

void* CudaWeights::Rows(const WeightSpec& spec, int64_t first_row) const {
  const int64_t index = &spec - plan_->specs().data();
  return buffer_.at(offsets_[index] + first_row * std::max<int64_t>(spec.cols, 1) * element_bytes_);
}

absl::Status CudaWeights::StoreDummy(const WeightSpec& spec, int64_t first_row,
                                     const WeightPart& part) {
  const DummyRange range = DummyWeightRange(part.name, spec.fan_in());
  const kc::RandomFillParams fill{.output = Rows(spec, first_row),
                                  .num_elements = part.rows * std::max<int64_t>(spec.cols, 1),
                                  .low = range.low,
                                  .high = range.high,
                                  .seed = DummyTensorSeed(part.name),
                                  .dtype = dtype_};
  LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(fill, stream_), StrCat("dummy values of ", part.name));
  return absl::OkStatus();
}

absl::Status CudaWeights::Store(const WeightSpec& spec, int64_t first_row, const TensorView& t) {
  const std::string& name = t.name;
  void* dst = Rows(spec, first_row);
  const int64_t elements = t.NumElements();
  if (t.dtype == dtype_) {  // already in the runner's dtype: copy as is
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dst, t.data, static_cast<size_t>(t.num_bytes),
                                                 cudaMemcpyHostToDevice, stream_),
                                 StrCat("uploading ", name));
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), StrCat("uploading ", name));
    return absl::OkStatus();
  }
  // Upload the file's bytes to a staging buffer and convert them on the GPU.
  LMSERVE_ASSIGN_OR_RETURN(CudaBuffer staging,
                           CudaBuffer::Device(t.num_bytes, StrCat("staging ", name)));
  const kc::DequantizeParams convert{.src = staging.get(),
                                     .dst = dst,
                                     .num_elements = elements,
                                     .dtype = t.dtype,
                                     .output_dtype = dtype_};
  if (convert.Validate().ok()) {
    LMSERVE_RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(staging.get(), t.data, static_cast<size_t>(t.num_bytes),
                        cudaMemcpyHostToDevice, stream_),
        StrCat("uploading ", name));
    LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(convert, stream_), StrCat("converting ", name));
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), StrCat("converting ", name));
    return absl::OkStatus();
  }
  // Shapes the GPU converter does not take (a count off its block multiple): on the host.
  std::vector<float> f32(static_cast<size_t>(elements));
  kernels::DequantizeToF32(t.dtype, t.data, f32.data(), elements);
  std::vector<uint16_t> bf16;
  const void* host = f32.data();
  if (dtype_ == DType::kBF16) {
    bf16.resize(f32.size());
    for (size_t i = 0; i < f32.size(); ++i) bf16[i] = kernels::F32ToBf16(f32[i]);
    host = bf16.data();
  }
  LMSERVE_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(dst, host, static_cast<size_t>(elements * element_bytes_),
                      cudaMemcpyHostToDevice, stream_),
      StrCat("uploading ", name));
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), StrCat("uploading ", name));
  return absl::OkStatus();
}

}  // namespace lmserve::engine::cuda
