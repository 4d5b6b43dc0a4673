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
// GGUF blocks (issue 23): a tensor given block types (ChooseBlockTypes: Q8_0, Q4_0, Q4_K, Q6_K,
// one a part) is held in kernels/cuda/quant_gemm.h's device layout of those blocks, one layout
// for each run of consecutive parts of one type (a BlockSegment): the file's blocks are uploaded
// and regrouped there (QuantRepack), dummy ones drawn there (QuantDummyFill).

#ifndef LMSERVE_ENGINE_RUNNER_CUDA_CUDA_WEIGHTS_H_
#define LMSERVE_ENGINE_RUNNER_CUDA_CUDA_WEIGHTS_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/checkpoint.h"
#include "engine/model/weight_plan.h"
#include "engine/runner/cuda/cuda_buffer.h"
#include "engine/runner/cuda/gemm_selector.h"
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

// The GGUF block type of each part of each tensor of `plan` held in blocks, by tensor index (an
// empty list: held in the runner's dtype). With a block type of RunnerQuantization (dummy
// weights), that type for every part of the IsQuantLinear tensors whose shapes it takes; with
// kGguf, each IsQuantLinear tensor (whole or split by rows) whose every part is of a
// type the GPU holds in blocks (kernels::cuda::SupportsQuantWeights) in a shape it takes, the
// parts' types; the gate/up projection only with one type for both (its epilogue pairs their
// rows). Everything else (other types, column slices of tensor parallelism, kAuto, kNone,
// kFp8): empty.
using BlockTypes = std::vector<std::vector<kernels::DType>>;
BlockTypes ChooseBlockTypes(const WeightPlan& plan, const Checkpoint& checkpoint,
                            RunnerQuantization quantization, LoadFormat format);

class CudaWeights final : public WeightSink {
 public:
  // Allocates room for every tensor of `plan` (which must outlive this) in `dtype` (kBF16 or
  // kF32), the IsF8Linear ones in FP8 where `fp8` (REQUIRES: dtype kBF16 then); loading goes to
  // `stream`.
  // `block_types`: ChooseBlockTypes' (empty: none); REQUIRES: dtype kBF16 where any is a block
  // type.
  static absl::StatusOr<CudaWeights> Allocate(const WeightPlan& plan, kernels::DType dtype,
                                              bool fp8, const BlockTypes& block_types,
                                              cudaStream_t stream);
  // The bytes Allocate takes for the same arguments (the memory plan's weights).
  static int64_t Bytes(const WeightPlan& plan, kernels::DType dtype, bool fp8,
                       const BlockTypes& block_types);

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
  // The segments of a tensor held in GGUF blocks; empty where it is held in the runner's dtype or
  // FP8.
  const std::vector<BlockSegment>& Blocks(Weight weight) const {
    return segments_[plan_->Storage(weight).index];
  }
  bool HoldsBlocks() const;
  int64_t bytes() const { return buffer_.bytes(); }

 private:
  bool IsF8(const WeightSpec& spec) const { return fp8_ && IsF8Linear(spec); }
  int64_t Index(const WeightSpec& spec) const { return &spec - plan_->specs().data(); }
  // The segment of `spec` holding row `row`, or null.
  const BlockSegment* SegmentOf(const WeightSpec& spec, int64_t row) const;
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
  std::vector<std::vector<BlockSegment>> segments_;  // by Weight::index
};

}  // namespace lmserve::engine::cuda

#endif  // LMSERVE_ENGINE_RUNNER_CUDA_CUDA_WEIGHTS_H_
