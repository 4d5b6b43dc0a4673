#include "engine/runner/cuda/gemm_selector.h"

#include <algorithm>
#include <functional>
#include <limits>

#include "common/status.h"
#include "common/strings.h"
#include "engine/runner/cuda/cuda_buffer.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/gemm_sm90.h"
#include "kernels/cuda/quant_gemm.h"
#include "kernels/cuda/skinny_gemm.h"

namespace lmserve::engine::cuda {
namespace {

namespace kc = kernels::cuda;

kc::SkinnyGemmParams SkinnyParams(const kc::GemmShape& shape, const void* x, const void* w,
                                  void* y) {
  return {.x = x,
          .w = w,
          .y = y,
          .m = shape.m,
          .n = shape.n,
          .k = shape.k,
          .input_dtype = shape.input_dtype,
          .output_dtype = shape.output_dtype};
}

}  // namespace

kc::SiluAndMulParams GemmSelector::SiluAndMul(const GemmProjection& projection, int64_t m,
                                              const void* gate_up, void* act,
                                              kernels::GateActivation activation) const {
  return {.gate_up = gate_up,
          .output = act,
          .num_tokens = m,
          .intermediate_size = projection.n / 2,
          .dtype = dtype_,
          .activation = activation};
}

GemmSelector::GemmSelector(cublasLtHandle_t blas, void* workspace, size_t workspace_bytes,
                           cudaStream_t stream, kernels::DType dtype, DecodeGemm choice)
    : blas_(blas),
      workspace_(workspace),
      workspace_bytes_(workspace_bytes),
      stream_(stream),
      dtype_(dtype),
      choice_(choice) {}

int GemmSelector::Add(GemmProjection projection) {
  projections_.push_back(std::move(projection));
  return static_cast<int>(projections_.size() - 1);
}

absl::StatusOr<const kc::GemmPlan*> GemmSelector::Plan(int id, int64_t m) {
  auto& slot = plans_[{id, m}];
  if (slot != nullptr) return slot.get();
  const GemmProjection& p = projections_[id];
  const kc::GemmShape shape{.m = m,
                            .n = p.n,
                            .k = p.k,
                            .input_dtype = p.f8 ? kernels::DType::kF8E4M3 : dtype_,
                            .output_dtype = p.output_dtype};
  LMSERVE_ASSIGN_OR_RETURN(
      slot, kc::GemmPlan::Create(blas_, shape, workspace_, workspace_bytes_, autotune_, stream_));
  return slot.get();
}

absl::StatusOr<GemmSelector::Kernel> GemmSelector::Choose(int id, const kc::GemmPlan& plan,
                                                          const void* x, void* y, void* act,
                                                          kernels::GateActivation activation) {
  // The skinny kernel is bf16 only: float32 runs every GEMM through cuBLASLt.
  if (dtype_ != kernels::DType::kBF16) return Kernel::kBlas;
  const int64_t m = plan.shape().m;
  const auto key = std::make_pair(id, m);
  if (auto it = kernels_.find(key); it != kernels_.end()) return it->second;
  const GemmProjection& projection = projections_[id];
  kc::SkinnyGemmParams skinny =
      SkinnyParams(plan.shape(), x, projection.weights[0], act != nullptr ? act : y);
  skinny.silu_and_mul = act != nullptr;
  skinny.activation = activation;
  const bool skinny_ok = m <= kc::kMaxSkinnyGemmRows && skinny.Validate().ok();
  if (choice_ == DecodeGemm::kBlas || !skinny_ok) return kernels_[key] = Kernel::kBlas;
  if (choice_ == DecodeGemm::kSkinny) return kernels_[key] = Kernel::kSkinny;
  // One row of a decoder layer: the skinny kernel, untimed. Timed alone, cuBLASLt's split-K
  // kernels for the down projection sometimes came out ahead on H200s, by as much as 5%; in the
  // step, where the skinny kernel overlaps its launch and first loads with the kernel before it,
  // they ran 1.5-3 us a layer slower every time (kernel timelines of lmserve-model-bench).
  if (m == 1 && !projection.logits) return kernels_[key] = Kernel::kSkinny;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamIsCapturing(stream_, &capturing), "cudaStreamIsCapturing");
  if (capturing != cudaStreamCaptureStatusNone) return Kernel::kBlas;
  // The candidates, each a pass over every layer's weights.
  std::vector<std::pair<Kernel, std::function<void()>>> candidates;
  // (Only the layers held in the runner's dtype: a layer in GGUF blocks has its own kernels.)
  candidates.emplace_back(Kernel::kBlas, [&] {
    for (size_t i = 0; i < projection.weights.size(); ++i) {
      if (HeldInBlocks(projection, i)) continue;
      plan.Run(x, projection.weights[i], y, stream_);
      if (act != nullptr) kc::Launch(SiluAndMul(projection, m, y, act, activation), stream_);
    }
  });
  candidates.emplace_back(Kernel::kSkinny, [&] {
    for (size_t i = 0; i < projection.weights.size(); ++i) {
      if (HeldInBlocks(projection, i)) continue;
      skinny.w = projection.weights[i];
      kc::Launch(skinny, stream_);
    }
  });
  LMSERVE_ASSIGN_OR_RETURN(const Kernel best, Fastest(candidates, projection.kind));
  return kernels_[key] = best;
}

absl::Status GemmSelector::SettleLarge(int id, kc::GemmPlan* plan, const void* x, const void* w,
                                       void* y) {
  const int64_t m = plan->shape().m;
  if (settled_[{id, m}]) return absl::OkStatus();
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamIsCapturing(stream_, &capturing), "cudaStreamIsCapturing");
  if (capturing != cudaStreamCaptureStatusNone) return absl::OkStatus();
  int64_t bucket = kMinTunedGemmRows;
  while (bucket < m) bucket *= 2;
  settled_[{id, m}] = true;
  if (auto it = tuned_.find({id, bucket}); it != tuned_.end()) {
    plan->TryAlgorithm(it->second);  // else the heuristic's choice stays
    return absl::OkStatus();
  }
  if (const absl::Status s = plan->Tune(x, w, y, stream_); !s.ok()) {
    return absl::InternalError(
        StrCat("CUDA runner: tuning the ", projections_[id].kind, " GEMM: ", s.message()));
  }
  tuned_[{id, bucket}] = plan->algorithm();
  return absl::OkStatus();
}

absl::StatusOr<GemmSelector::Kernel> GemmSelector::Fastest(
    const std::vector<std::pair<Kernel, std::function<void()>>>& candidates,
    const std::string& kind) {
  cudaEvent_t start = nullptr, stop = nullptr;
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaEventCreate(&start), "cudaEventCreate");
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaEventCreate(&stop), "cudaEventCreate");
  // Rounds that time every candidate in turn (after two warm-up rounds), so that a clock or
  // neighbour's change hits them alike; the median of 7 each. A single pass each, in order, once
  // let cuBLASLt win gate/up at one row on an H200 that ran it 8% slower in the step.
  std::vector<std::vector<float>> times(candidates.size());
  for (int round = 0; round < 9; ++round) {
    for (size_t i = 0; i < candidates.size(); ++i) {
      cudaEventRecord(start, stream_);
      candidates[i].second();
      cudaEventRecord(stop, stream_);
      cudaEventSynchronize(stop);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      if (round >= 2) times[i].push_back(ms);
    }
  }
  // The fastest median; a tie goes to the later candidate (the skinny kernel over cuBLASLt).
  Kernel best = candidates[0].first;
  float best_ms = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < candidates.size(); ++i) {
    std::sort(times[i].begin(), times[i].end());
    if (const float median = times[i][times[i].size() / 2]; median <= best_ms) {
      best = candidates[i].first, best_ms = median;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaGetLastError(), StrCat("timing the ", kind, " GEMMs"));
  return best;
}

absl::StatusOr<GemmSelector::Kernel> GemmSelector::ChooseF8(int id, int64_t m, const void* x,
                                                            void* y, void* act,
                                                            kernels::GateActivation activation) {
  const auto key = std::make_pair(id, m);
  if (auto it = kernels_.find(key); it != kernels_.end()) return it->second;
  const GemmProjection& projection = projections_[id];
  if (choice_ == DecodeGemm::kBlas) return kernels_[key] = Kernel::kBlas;
  if (choice_ == DecodeGemm::kSkinny || (m == 1 && !projection.logits)) {
    return kernels_[key] = Kernel::kSkinny;
  }
  // 2 to 8 rows: the skinny kernel's multiply-adds per weight byte grow with the rows (twice
  // bf16's per byte), so it may stop being bound by memory before 8; timed against the per-token
  // quantization and cuBLASLt's FP8 GEMM, as the bf16 choice is.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamIsCapturing(stream_, &capturing), "cudaStreamIsCapturing");
  if (capturing != cudaStreamCaptureStatusNone) return Kernel::kSkinny;
  LMSERVE_ASSIGN_OR_RETURN(const kc::GemmPlan* plan, Plan(id, m));
  (void)plan;  // created (and autotuned) before the timing
  std::vector<std::pair<Kernel, std::function<void()>>> candidates;
  int64_t layer = 0;
  candidates.emplace_back(Kernel::kBlas, [&] {
    for (layer = 0; layer < static_cast<int64_t>(projection.weights.size()); ++layer) {
      (void)RunF8Blas(id, layer, m, x, y, act, activation);
    }
  });
  candidates.emplace_back(Kernel::kSkinny, [&] {
    for (layer = 0; layer < static_cast<int64_t>(projection.weights.size()); ++layer) {
      const kc::F8SkinnyGemmParams params{.x = x,
                                          .w = projection.weights[layer],
                                          .w_scales = projection.scales[layer],
                                          .y = act != nullptr ? act : y,
                                          .m = m,
                                          .n = projection.n,
                                          .k = projection.k,
                                          .input_dtype = dtype_,
                                          .output_dtype = projection.output_dtype,
                                          .silu_and_mul = act != nullptr,
                                          .activation = activation};
      kc::Launch(params, stream_);
    }
  });
  LMSERVE_ASSIGN_OR_RETURN(const Kernel best, Fastest(candidates, projection.kind));
  return kernels_[key] = best;
}

absl::Status GemmSelector::RunF8(int id, int64_t layer, int64_t m, const void* x, void* y,
                                 void* act, bool late_dependents,
                                 kernels::GateActivation activation, F8OutputScales* unscaled,
                                 const GemmResidualFolds* folds) {
  const GemmProjection& projection = projections_[id];
  const void* w = projection.weights[layer];
  const float* w_scales = projection.scales[layer];
  const bool input_quantized = folds != nullptr && folds->input_quantized;
  const bool hold_activation = folds != nullptr && folds->hold_activation;
  if ((input_quantized || hold_activation) && !QuantizedInput(id, m).has_value()) {
    return absl::InternalError(StrCat("CUDA runner: ", projection.kind, " at ", m,
                                      " rows quantizes no input, yet was given one quantized "
                                      "or asked to hold its activation"));
  }
  Kernel kernel = Kernel::kBlas;
  if (m <= kc::kMaxSkinnyGemmRows) {
    LMSERVE_ASSIGN_OR_RETURN(kernel, ChooseF8(id, m, x, y, act, activation));
  }
  if (kernel == Kernel::kSkinny) {
    kc::F8SkinnyGemmParams params{.x = x,
                                        .w = w,
                                        .w_scales = w_scales,
                                        .y = act != nullptr ? act : y,
                                        .m = m,
                                        .n = projection.n,
                                        .k = projection.k,
                                        .input_dtype = dtype_,
                                        .output_dtype = projection.output_dtype,
                                        .silu_and_mul = act != nullptr,
                                        .activation = activation,
                                        .late_dependents = late_dependents};
    if (folds != nullptr && folds->OneRow()) {
      params.add_norm_residual = folds->add_norm_residual;
      params.add_norm_weight = folds->add_norm_weight;
      params.add_norm_epsilon = folds->add_norm_epsilon;
      params.settle_residual = folds->settle_residual;
    }
    LMSERVE_RETURN_IF_ERROR(params.Validate());
    LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(params, stream_),
                                 StrCat("FP8 skinny GEMM (", projection.kind, ")"));
    return absl::OkStatus();
  }
  if (folds != nullptr && folds->OneRow()) {
    return absl::InternalError(StrCat("CUDA runner: ", projection.kind, " at ", m,
                                      " rows: residual folds without the FP8 skinny GEMM"));
  }
  return RunF8Blas(id, layer, m, x, y, act, activation, unscaled, input_quantized,
                   hold_activation && act != nullptr);
}

absl::Status GemmSelector::RunHeldActivation(int id) {
  if (!held_activation_.has_value()) return absl::OkStatus();
  kc::SiluAndMulParams params = *held_activation_;
  held_activation_.reset();
  if (id >= 0) {
    const std::optional<F8QuantizedInput> input = QuantizedInput(id, params.num_tokens);
    if (!input.has_value() || projections_[id].k != params.intermediate_size) {
      return absl::InternalError(StrCat("CUDA runner: ", projections_[id].kind,
                                        " cannot take the held activation's rows quantized"));
    }
    params.output = nullptr;
    params.f8_output = input->rows;
    params.f8_output_scales = input->scales;
  }
  LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(params, stream_), "gated activation");
  return absl::OkStatus();
}

std::optional<F8QuantizedInput> GemmSelector::QuantizedInput(int id, int64_t m) const {
  const GemmProjection& projection = projections_[id];
  if (!projection.f8 || m <= kc::kMaxSkinnyGemmRows || dtype_ != kernels::DType::kBF16 ||
      f8_x_ == nullptr || m > f8_max_rows_ || projection.k > f8_max_cols_) {
    return std::nullopt;
  }
  return F8QuantizedInput{.rows = f8_x_, .scales = f8_x_scales_};
}

absl::Status GemmSelector::RunF8Blas(int id, int64_t layer, int64_t m, const void* x, void* y,
                                     void* act, kernels::GateActivation activation,
                                     F8OutputScales* unscaled, bool input_quantized,
                                     bool hold_activation) {
  const GemmProjection& projection = projections_[id];
  const void* w = projection.weights[layer];
  const float* w_scales = projection.scales[layer];
  if (m > f8_max_rows_ || projection.k > f8_max_cols_) {
    return absl::InternalError(StrCat("CUDA runner: ", projection.kind, " FP8 GEMM of ", m,
                                      " rows, ", projection.k, " columns exceeds its workspace (",
                                      f8_max_rows_, " x ", f8_max_cols_, ")"));
  }
  const kc::F8QuantizeRowsParams quantize{.src = x,
                                          .dst = f8_x_,
                                          .scales = f8_x_scales_,
                                          .rows = m,
                                          .cols = projection.k,
                                          .src_dtype = dtype_};
  if (!input_quantized) {
    LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(quantize, stream_),
                                 StrCat("quantizing the input of ", projection.kind));
  }
  LMSERVE_ASSIGN_OR_RETURN(const kc::GemmPlan* plan, Plan(id, m));
  // Where a kernel after cuBLASLt would apply the scales (gemm.h), the gated activation applies
  // them as it reads the product instead, or the caller's next kernel (`unscaled`): one pass
  // over [m, n] less.
  const bool scales_later = !plan->fp8_outer_vector_scales() && dtype_ == kernels::DType::kBF16 &&
                            kc::Aligned16(w_scales);
  const bool scales_in_activation = act != nullptr && scales_later;
  const bool scales_to_caller = act == nullptr && unscaled != nullptr && scales_later;
  if (const cublasStatus_t status = plan->Run(f8_x_, w, y, stream_, w_scales, f8_x_scales_,
                                              scales_in_activation || scales_to_caller);
      status != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(StrCat("CUDA runner: ", projection.kind,
                                      " FP8 GEMM: cuBLAS status ", static_cast<int>(status)));
  }
  if (act != nullptr) {
    kc::SiluAndMulParams params = SiluAndMul(projection, m, y, act, activation);
    if (scales_in_activation) {
      params.row_scales = f8_x_scales_;
      params.col_scales = w_scales;
    }
    if (hold_activation) {
      held_activation_ = params;
      return absl::OkStatus();
    }
    LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(params, stream_), "gated activation");
  }
  if (scales_to_caller) {
    const kc::GemmShape& shape = plan->shape();
    *unscaled = {.rows = f8_x_scales_,
                 .cols = w_scales,
                 .m = m,
                 .n = shape.n,
                 .y_stride = shape.y_stride != 0 ? shape.y_stride : shape.n};
  }
  return absl::OkStatus();
}

absl::Status GemmSelector::RunAccumulate(int id, int64_t layer, int64_t m, const void* x, void* y,
                                         void* tune_scratch) {
  const GemmProjection& projection = projections_[id];
  if (projection.f8) {
    return absl::InternalError(
        StrCat("CUDA runner: ", projection.kind, ": an accumulating FP8 projection"));
  }
  LMSERVE_ASSIGN_OR_RETURN(const kc::GemmPlan* plan, Plan(id, m));
  const void* w = projection.weights[layer];
  if (m > kMinTunedGemmRows && tune_large_) {
    LMSERVE_RETURN_IF_ERROR(SettleLarge(id, plans_[{id, m}].get(), x, w, tune_scratch));
  }
  if (const cublasStatus_t status = plan->RunAccumulate(x, w, y, stream_);
      status != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(StrCat("CUDA runner: ", projection.kind,
                                      " GEMM (accumulating): cuBLAS status ",
                                      static_cast<int>(status)));
  }
  return absl::OkStatus();
}

bool GemmSelector::SkinnyAtOneRow(int64_t n, int64_t k) const {
  // Choose's rule at one row; Validate's shape (the pointers are the runner's, 16-byte aligned).
  return dtype_ == kernels::DType::kBF16 && choice_ != DecodeGemm::kBlas && n % 2 == 0 &&
         k % 8 == 0;
}

bool GemmSelector::FoldsAtOneRow(int id, int64_t layer) const {
  const GemmProjection& projection = projections_[id];
  if (projection.logits) return false;
  if (HeldInBlocks(projection, static_cast<size_t>(layer))) {
    // RunBlocks' rule at one row: every segment on the integer products (quant_gemm.h).
    if (choice_ == DecodeGemm::kBlas || projection.output_dtype != dtype_) return false;
    for (const BlockSegment& segment : projection.blocks[static_cast<size_t>(layer)]) {
      if (!kc::QuantSkinnyRoundsX(segment.type, 1, projection.k)) return false;
    }
    return true;
  }
  if (projection.f8) {  // ChooseF8's rule at one row; F8SkinnyGemmParams::Validate's shape
    return dtype_ == kernels::DType::kBF16 && choice_ != DecodeGemm::kBlas &&
           projection.n % 2 == 0 && projection.k % 16 == 0;
  }
  return SkinnyAtOneRow(projection.n, projection.k);
}

absl::Status GemmSelector::RunBlocks(int id, int64_t layer, int64_t m, const void* x, void* y,
                                     void* act, bool late_dependents,
                                     kernels::GateActivation activation,
                                     const GemmResidualFolds* folds) {
  const GemmProjection& projection = projections_[id];
  const std::vector<BlockSegment>& segments = projection.blocks[layer];
  if (act != nullptr && segments.size() != 1) {
    return absl::InternalError(StrCat("CUDA runner: ", projection.kind,
                                      ": a gated activation over ", segments.size(),
                                      " block segments"));
  }
  if (m <= kc::kMaxSkinnyGemmRows && choice_ != DecodeGemm::kBlas) {
    const int64_t out_bytes = projection.output_dtype == kernels::DType::kF32 ? 4 : 2;
    for (const BlockSegment& segment : segments) {
      kc::QuantSkinnyGemmParams params{
          .x = x,
          .w = segment.data,
          .w_dtype = segment.type,
          .y = act != nullptr ? act : static_cast<char*>(y) + segment.first_row * out_bytes,
          .m = m,
          .n = segment.rows,
          .k = projection.k,
          .y_stride = act != nullptr ? 0 : projection.n,
          .input_dtype = dtype_,
          .output_dtype = projection.output_dtype,
          .silu_and_mul = act != nullptr,
          .activation = activation,
          .late_dependents = late_dependents};
      if (folds != nullptr && folds->OneRow()) {  // each segment folds the norm of the whole row
        params.add_norm_residual = folds->add_norm_residual;
        params.add_norm_weight = folds->add_norm_weight;
        params.add_norm_epsilon = folds->add_norm_epsilon;
        if (folds->settle_residual != nullptr) {  // and settles its own rows
          params.settle_residual = folds->settle_residual + segment.first_row;
        }
      }
      LMSERVE_RETURN_IF_ERROR(params.Validate());
      LMSERVE_RETURN_IF_CUDA_ERROR(
          kc::Launch(params, stream_),
          StrCat(kernels::DTypeName(segment.type), " skinny GEMM (", projection.kind, ")"));
    }
    return absl::OkStatus();
  }
  if (projection.n * projection.k * 2 > dequant_bytes_) {
    return absl::InternalError(StrCat("CUDA runner: ", projection.kind, " [", projection.n, ", ",
                                      projection.k, "] exceeds the dequantization scratch (",
                                      dequant_bytes_, " bytes)"));
  }
  for (const BlockSegment& segment : segments) {
    const kc::QuantDequantizeParams dequantize{
        .w = segment.data,
        .dst = static_cast<char*>(dequant_) + segment.first_row * projection.k * 2,
        .dtype = segment.type,
        .rows = segment.rows,
        .cols = projection.k};
    LMSERVE_RETURN_IF_ERROR(dequantize.Validate());
    LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(dequantize, stream_),
                                 StrCat("dequantizing ", projection.kind));
  }
  LMSERVE_ASSIGN_OR_RETURN(const kc::GemmPlan* plan, Plan(id, m));
  if (const cublasStatus_t status = plan->Run(x, dequant_, y, stream_);
      status != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(StrCat("CUDA runner: ", projection.kind, " GEMM: cuBLAS status ",
                                      static_cast<int>(status)));
  }
  if (act != nullptr) {
    LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(SiluAndMul(projection, m, y, act, activation), stream_),
                                 "gated activation");
  }
  return absl::OkStatus();
}

absl::Status GemmSelector::Run(int id, int64_t layer, int64_t m, const void* x, void* y, void* act,
                               bool late_dependents, kernels::GateActivation activation,
                               const GemmNormEpilogue* norm, F8OutputScales* unscaled,
                               const GemmResidualFolds* folds) {
  if (unscaled != nullptr) *unscaled = {};
  if (held_activation_.has_value()) {
    return absl::InternalError(StrCat("CUDA runner: ", projections_[id].kind,
                                      " runs while a held gated activation was never run"));
  }
  if (folds != nullptr && folds->OneRow() &&
      (m != 1 || !FoldsAtOneRow(id, layer) ||
       (act != nullptr && folds->settle_residual != nullptr))) {
    return absl::InternalError(StrCat("CUDA runner: ", projections_[id].kind, " at ", m,
                                      " rows: residual folds without the skinny GEMM"));
  }
  if (HeldInBlocks(projections_[id], static_cast<size_t>(layer))) {
    if (norm != nullptr) {  // the quantized kernels have no norm epilogue
      return absl::InternalError(StrCat("CUDA runner: ", projections_[id].kind,
                                        ": a norm epilogue on a projection in GGUF blocks"));
    }
    return RunBlocks(id, layer, m, x, y, act, late_dependents, activation, folds);
  }
  if (projections_[id].f8) {
    if (norm != nullptr) {  // the FP8 kernels have no norm epilogue (SkinnyAtOneRow says so)
      return absl::InternalError(StrCat("CUDA runner: ", projections_[id].kind,
                                        ": a norm epilogue on an FP8 projection"));
    }
    return RunF8(id, layer, m, x, y, act, late_dependents, activation, unscaled, folds);
  }
  LMSERVE_ASSIGN_OR_RETURN(const kc::GemmPlan* plan, Plan(id, m));
  const GemmProjection& projection = projections_[id];
  const void* w = projection.weights[layer];
  if (m > kMinTunedGemmRows && tune_large_) {
    LMSERVE_RETURN_IF_ERROR(SettleLarge(id, plans_[{id, m}].get(), x, w, y));
  }
  if (m <= kc::kMaxSkinnyGemmRows) {
    LMSERVE_ASSIGN_OR_RETURN(const Kernel kernel, Choose(id, *plan, x, y, act, activation));
    if (kernel == Kernel::kSkinny) {
      kc::SkinnyGemmParams params = SkinnyParams(plan->shape(), x, w, act != nullptr ? act : y);
      params.silu_and_mul = act != nullptr;
      params.activation = activation;
      params.late_dependents = late_dependents;
      params.l2_prefetch_bytes = l2_prefetch_bytes_;
      params.k_split = split_k_ ? 0 : 1;
      if (norm != nullptr) {
        params.norm_partials = norm->partials;
        params.num_norm_partials = norm->num_partials;
        params.norm_width = norm->width;
        params.norm_epsilon = norm->epsilon;
      }
      if (folds != nullptr) {
        params.add_norm_residual = folds->add_norm_residual;
        params.add_norm_weight = folds->add_norm_weight;
        params.add_norm_epsilon = folds->add_norm_epsilon;
        params.settle_residual = folds->settle_residual;
      }
      LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(params, stream_), "skinny GEMM");
      return absl::OkStatus();
    }
  }
  if (norm != nullptr || folds != nullptr) {
    return absl::InternalError(StrCat("CUDA runner: ", projection.kind, " at ", m,
                                      " rows: a norm epilogue or residual folds without the "
                                      "skinny GEMM"));
  }
  if (act != nullptr && sm90_gated_ && m >= kMinSm90GatedRows &&
      projection.output_dtype == dtype_ && kc::UseHopperKernels() && kc::Sm90GemmAvailable()) {
    const kc::Sm90GemmParams params{
        .x = x,
        .w = w,
        .y = act,
        .m = m,
        .n = projection.n,
        .k = projection.k,
        .dtype = dtype_,
        .epilogue = activation == kernels::GateActivation::kSilu
                        ? kc::Sm90GemmEpilogue::kSiluAndMul
                        : kc::Sm90GemmEpilogue::kGeluTanhAndMul,
        .cluster = 2};
    if (kc::Sm90GemmSupports(params)) {
      LMSERVE_RETURN_IF_CUDA_ERROR(kc::LaunchSm90Gemm(params, stream_),
                                   StrCat("Hopper GEMM (", projection.kind, ")"));
      ++sm90_gated_runs_;
      return absl::OkStatus();
    }
  }
  if (const cublasStatus_t status = plan->Run(x, w, y, stream_); status != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(StrCat("CUDA runner: ", projection.kind, " GEMM: cuBLAS status ",
                                      static_cast<int>(status)));
  }
  if (act != nullptr) {
    LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(SiluAndMul(projection, m, y, act, activation), stream_),
                                 "gated activation");
  }
  return absl::OkStatus();
}

}  // namespace lmserve::engine::cuda
