// The CUDA runner's weights: every tensor of the model's WeightPlan in one device allocation, in
// the runner's element type, each 256-byte aligned, in declaration order. GGUF-quantized and
// fp16/fp32/bf16 tensors are converted on the GPU (kernels/cuda/dequant.h, bit-exact with the
// CPU's conversion); dummy weights are drawn there (kernels/cuda/random_fill.h).
//
// With FP8 (RunnerQuantization::kFp8), the matrices of the linear layers (IsF8Linear) are held as
// E4M3 bytes [rows, cols] followed by fp32 scales [rows], one per output channel (a fused tensor's
// parts keep their own): an FP8 checkpoint's per-tensor or per-channel tensors are copied as they
// are (StoreF8); any other tensor, and dummy values, are converted to bf16 on the GPU and
// quantized there per row (kernels/cuda/fp8.h, F8QuantizeRows: the CPU's QuantizeRowsF8E4M3).
//
// GGUF blocks (issue 23): a tensor given a block type (ChooseBlockTypes: Q8_0, Q4_0, Q4_K, Q6_K)
// is held in kernels/cuda/quant_gemm.h's device layout of those blocks: the file's blocks are
// uploaded and regrouped there (QuantRepack), dummy ones drawn there (QuantDummyFill).

#ifndef LMSERVE_ENGINE_RUNNER_CUDA_CUDA_WEIGHTS_H_
#define LMSERVE_ENGINE_RUNNER_CUDA_CUDA_WEIGHTS_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/checkpoint.h"
#include "engine/model/weight_plan.h"
#include "engine/runner/cuda/cuda_buffer.h"
#include "engine/runner/weight_loader.h"
#include "kernels/dtype.h"

namespace lmserve::engine::cuda {

// Whether `spec` is one of the matrices the CUDA runner holds in FP8 when asked to: the linear
// layers' (qkv, o_proj, gate_up, down_proj, ssm_in_proj, ssm_out_proj) with rows and columns
// multiples of 16 (cuBLASLt's FP8 GEMM). Embeddings, the LM head, norms, biases, routers and
// experts are not.
bool IsF8Linear(const WeightSpec& spec);

// Whether `spec` is one of the matrices the CUDA runner may hold in GGUF blocks: the decoder's
// linear layers (qkv, o_proj, gate_up, down_proj), not tied, no load offset.
bool IsQuantLinear(const WeightSpec& spec);

// The GGUF block type each tensor of `plan` is held in (kernels::DType::kF32 where it is held in
// the runner's dtype), by index: with a block type of RunnerQuantization (dummy weights), that
// type for every IsQuantLinear tensor whose shape it takes; with kAuto or kGguf, for each
// IsQuantLinear tensor whose parts are all of one type the GPU holds in blocks
// (kernels::cuda::SupportsQuantWeights), whole or split by rows, that type. Every other tensor
// (other types, mixed parts, column slices of tensor parallelism, kNone, kFp8) gets kF32.
std::vector<kernels::DType> ChooseBlockTypes(const WeightPlan& plan, const Checkpoint& checkpoint,
                                             RunnerQuantization quantization, LoadFormat format);

class CudaWeights final : public WeightSink {
 public:
  // Allocates room for every tensor of `plan` (which must outlive this) in `dtype` (kBF16 or
  // kF32), the IsF8Linear ones in FP8 where `fp8` (REQUIRES: dtype kBF16 then); loading goes to
  // `stream`.
  // `block_types`: ChooseBlockTypes' (empty: none); REQUIRES: dtype kBF16 where any is a block
  // type.
  static absl::StatusOr<CudaWeights> Allocate(const WeightPlan& plan, kernels::DType dtype,
                                              bool fp8, std::vector<kernels::DType> block_types,
                                              cudaStream_t stream);
  // The bytes Allocate takes for the same arguments (the memory plan's weights).
  static int64_t Bytes(const WeightPlan& plan, kernels::DType dtype, bool fp8,
                       const std::vector<kernels::DType>& block_types);

  absl::Status Store(const WeightSpec& spec, int64_t first_row, const TensorView& tensor) override;
  absl::Status StoreDummy(const WeightSpec& spec, int64_t first_row,
                          const WeightPart& part) override;
  bool HoldsF8(const WeightSpec& spec) const override { return IsF8(spec); }
  absl::Status StoreF8(const WeightSpec& spec, int64_t first_row, const TensorView& tensor,
                       const std::vector<float>& row_scales) override;

  // The tensor's device address (a tied tensor's is its target's).
  const void* operator[](Weight weight) const {
    return buffer_.at(offsets_[plan_->Storage(weight).index]);
  }
  // Whether the tensor is held in FP8, and then its scales: [rows] fp32, device.
  bool IsF8(Weight weight) const { return IsF8(plan_->specs()[plan_->Storage(weight).index]); }
  const float* Scales(Weight weight) const;
  // The GGUF block type the tensor is held in (its address is then its device layout,
  // kernels/cuda/quant_gemm.h); nullopt where it is held in the runner's dtype or FP8.
  std::optional<kernels::DType> BlockType(Weight weight) const {
    return BlockTypeOf(plan_->Storage(weight).index);
  }
  bool HoldsBlocks() const;
  int64_t bytes() const { return buffer_.bytes(); }

 private:
  bool IsF8(const WeightSpec& spec) const { return fp8_ && IsF8Linear(spec); }
  int64_t Index(const WeightSpec& spec) const { return &spec - plan_->specs().data(); }
  std::optional<kernels::DType> BlockTypeOf(int64_t index) const {
    if (block_types_.empty() || !kernels::IsQuantized(block_types_[index])) return std::nullopt;
    return block_types_[index];
  }
  // Rows from `first_row` on of `spec`'s storage, and (FP8) their scales.
  void* Rows(const WeightSpec& spec, int64_t first_row) const;
  float* RowScales(const WeightSpec& spec, int64_t first_row) const;
  // Converts `tensor` to `dtype` (kBF16 or kF32) at dst (device).
  absl::Status StoreAs(void* dst, kernels::DType dtype, const TensorView& tensor) const;
  // FP8: quantizes `rows` rows of `spec` from first_row on, given in bf16 (device).
  absl::Status QuantizeRows(const WeightSpec& spec, int64_t first_row, int64_t rows,
                            const void* bf16, const std::string& name);

  const WeightPlan* plan_ = nullptr;
  kernels::DType dtype_ = kernels::DType::kBF16;
  int64_t element_bytes_ = 2;
  bool fp8_ = false;
  cudaStream_t stream_ = nullptr;
  CudaBuffer buffer_;
  std::vector<int64_t> offsets_;  // by Weight::index; a tied tensor's is its target's
  std::vector<kernels::DType> block_types_;  // ChooseBlockTypes'; empty: none
};

}  // namespace lmserve::engine::cuda

#endif  // LMSERVE_ENGINE_RUNNER_CUDA_CUDA_WEIGHTS_H_
