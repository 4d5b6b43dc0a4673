// The CUDA runner's GEMMs: a cuBLASLt plan per projection and token count, and for steps of at
// most kMaxSkinnyGemmRows tokens the choice between cuBLASLt and the skinny GEMM (bf16 only).
//
// A projection is one kind of weight (engine/model/weight_plan.h: "qkv", "down_proj", the LM
// head), one matrix per layer, all of one shape. The choice is made once per projection and
// token count: by RunnerConfig::decode_gemm, or by timing both kernels in turn over every layer's
// weights (so that they come from memory, as in a step). Timing never happens while a CUDA graph
// is being captured: the graphs' choices are made in their warm-up runs.
//
// Steps of more than kMinTunedGemmRows tokens (prefill), with set_tune_large(true): cuBLASLt's
// algorithm is chosen by timing the heuristic's candidates on the first such step's own operands
// (GemmPlan::Tune), once per projection and bucket of token counts (the next power of two); a
// later token count of the bucket takes the tuned algorithm where cuBLASLt accepts it for its
// shape (else the heuristic's). These products are bound by compute, so one W, timed from the L2
// or not, ranks the candidates as a step does.

#ifndef LMSERVE_ENGINE_RUNNER_CUDA_GEMM_SELECTOR_H_
#define LMSERVE_ENGINE_RUNNER_CUDA_GEMM_SELECTOR_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runner/model_runner.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/gemm.h"
#include "kernels/dtype.h"

namespace lmserve::engine::cuda {

// Rows [first_row, first_row + rows) of a weight held in GGUF blocks, in one block type: the
// device layout of kernels/cuda/quant_gemm.h of a [rows, k] matrix. A fused weight whose parts
// are of different types (a Q4_K_M file's Q4_K q/k and Q6_K v) is several segments.
struct BlockSegment {
  kernels::DType type = kernels::DType::kQ4_K;
  const void* data = nullptr;  // device
  int64_t first_row = 0;
  int64_t rows = 0;
};

// Token counts above which cuBLASLt's algorithm may be tuned on the step's operands.
inline constexpr int64_t kMinTunedGemmRows = 256;
// Token counts from which a gated product may run the Hopper GEMM (set_sm90_gated): its tiles are
// 128 rows, so below this its grid leaves multiprocessors idle where cuBLASLt's smaller tiles
// would not.
inline constexpr int64_t kMinSm90GatedRows = 2048;

struct GemmProjection {
  std::string kind;                                     // for messages: "qkv"
  int64_t n = 0;                                        // output features
  int64_t k = 0;                                        // input features
  kernels::DType output_dtype = kernels::DType::kBF16;  // the runner's dtype, or kF32 (logits)
  bool logits = false;                                  // the LM head: timed even at one token
  std::vector<const void*> weights;                     // [n, k] each, one per layer; device
  // FP8 weights (E4M3 [n, k] bytes) with their scales, [n] fp32 per layer (device): steps of up
  // to kMaxSkinnyGemmRows tokens run the FP8 skinny kernel on x as it is (W8A16), larger ones
  // quantize x per token and run cuBLASLt's FP8 GEMM (kernels/cuda/fp8.h, gemm.h).
  bool f8 = false;
  std::vector<const float*> scales;
  // Per layer: the segments of a weight held in GGUF blocks (empty, or no entry, for the
  // runner's dtype; one segment with an activation epilogue). Steps of up to kMaxSkinnyGemmRows
  // tokens run the quantized skinny kernel on each segment (W4A16 / W8A16, untimed: a GEMM
  // would first dequantize all of W), larger ones (and every step under DecodeGemm::kBlas)
  // dequantize W into the dequant workspace and run the bf16 cuBLASLt plan.
  std::vector<std::vector<BlockSegment>> blocks;
};

// An FP8 product y[m, n] (row stride y_stride) left unscaled for the kernel that reads it next
// (GemmPlan::Run's `unscaled`): y[t, j] is to be multiplied by rows[t] * cols[j]. rows null: y
// is scaled. `rows` lives in the selector's workspace: valid until its next FP8 GEMM.
struct F8OutputScales {
  const float* rows = nullptr;  // device
  const float* cols = nullptr;  // device, 16-byte aligned
  int64_t m = 0, n = 0, y_stride = 0;
};

// The skinny kernel's norm epilogue (skinny_gemm.h: Mamba-2's gated RMSNorm, its gating done by
// the decode kernel), for Run at one row.
struct GemmNormEpilogue {
  const float* partials = nullptr;  // the row's partial sums of squares; device
  int64_t num_partials = 0;
  int64_t width = 0;
  float epsilon = 0.0f;
};

// What is folded into the kernels around a product. At one row, what the skinny kernel folds in
// (skinny_gemm.h): the add + RMSNorm before it (its residual set) and the residual it settles
// (settle_residual set). At more than kMaxSkinnyGemmRows rows of an FP8 projection:
// - `input_quantized`: the kernel before it wrote x's rows quantized per token where
//   GemmSelector::QuantizedInput says (the add + RMSNorm's or the gated activation's FP8 output),
//   and x itself was not written; the product takes them as they are;
// - `hold_activation` (with `act`): the gated activation after cuBLASLt is held back, for
//   GemmSelector::RunHeldActivation to run into the next product's quantized input.
struct GemmResidualFolds {
  const float* add_norm_residual = nullptr;  // fp32 [k]; device
  const void* add_norm_weight = nullptr;     // [k]; device
  float add_norm_epsilon = 0.0f;
  float* settle_residual = nullptr;          // fp32 [n]; device
  bool input_quantized = false;
  bool hold_activation = false;
  // Whether the skinny kernel's folds are set.
  bool OneRow() const { return add_norm_residual != nullptr || settle_residual != nullptr; }
};

// Where an FP8 product's per-token quantized input goes: E4M3 rows [m, k] (contiguous) and a
// scale a row [m] (F8QuantizeRows' layout, kernels/cuda/fp8.h); device.
struct F8QuantizedInput {
  void* rows = nullptr;
  float* scales = nullptr;
};

class GemmSelector {
 public:
  // `workspace` (device, workspace_bytes) serves every plan; all work goes to `stream`.
  GemmSelector(cublasLtHandle_t blas, void* workspace, size_t workspace_bytes, cudaStream_t stream,
               kernels::DType dtype, DecodeGemm choice);

  // The scratch of FP8 projections' quantized inputs: x_q [max_rows, max_cols] bytes and
  // x_scales [max_rows] fp32 (device, 16-byte aligned), for steps of more than
  // kMaxSkinnyGemmRows tokens. Required before such a step runs an FP8 projection.
  void SetF8Workspace(void* x_q, float* x_scales, int64_t max_rows, int64_t max_cols) {
    f8_x_ = x_q, f8_x_scales_ = x_scales, f8_max_rows_ = max_rows, f8_max_cols_ = max_cols;
  }

  // The scratch that weights held in GGUF blocks are dequantized into for larger steps: bytes
  // (device, 16-byte aligned) for the largest such [n, k] in bf16. Required before such a step.
  void SetDequantWorkspace(void* scratch, int64_t bytes) {
    dequant_ = scratch, dequant_bytes_ = bytes;
  }

  // Registers a projection and returns its id.
  int Add(GemmProjection projection);
  const GemmProjection& projection(int id) const { return projections_[id]; }

  // Whether plans created from now on are autotuned (timing cuBLASLt's candidates): on at
  // start-up, for the decode graphs' sizes; off for the sizes that steps bring later.
  void set_autotune(bool autotune) { autotune_ = autotune; }

  // y = x W^T with the `layer`th weights of projection `id`, for m rows. With `act`, W is a fused
  // [gate; up] projection and act = activation(gate) * up (SiLU or GELU-tanh: the skinny kernel's
  // epilogue, or a SiLU-and-mul kernel after cuBLASLt writes y). `late_dependents`: the next
  // kernel is another stream of weights, which may launch only once this one has read its own
  // (skinny_gemm.h). A projection is always run with the same activation (the choice of kernel
  // is kept per projection and row count).
  // `norm`: the norm epilogue, which needs the skinny kernel (SkinnyAtOneRow) at m 1.
  // `folds`: the same for GemmResidualFolds (FoldsAtOneRow).
  // `unscaled` (no `act`): an FP8 product whose scales a kernel after cuBLASLt would apply is
  // left unscaled and *unscaled says so (its rows set; null rows otherwise): the caller's next
  // kernel applies them (or F8ScaleOutput, if that kernel cannot).
  absl::Status Run(int id, int64_t layer, int64_t m, const void* x, void* y, void* act = nullptr,
                   bool late_dependents = false,
                   kernels::GateActivation activation = kernels::GateActivation::kSilu,
                   const GemmNormEpilogue* norm = nullptr, F8OutputScales* unscaled = nullptr,
                   const GemmResidualFolds* folds = nullptr);

  // y += x W^T through cuBLASLt (GemmPlan::RunAccumulate), y in the projection's output type
  // (fp32: the residual stream). `tune_scratch` (device, m n output elements) takes the tuning
  // runs' outputs where set_tune_large holds, so that y is written once. Not for FP8 projections.
  absl::Status RunAccumulate(int id, int64_t layer, int64_t m, const void* x, void* y,
                             void* tune_scratch);

  // Where the FP8 projection `id` at m rows takes cuBLASLt's path (more than kMaxSkinnyGemmRows
  // rows; bf16 activations): where its quantized input goes, for the kernel before it to write
  // (GemmResidualFolds::input_quantized). Nullopt where it quantizes no input at m rows.
  std::optional<F8QuantizedInput> QuantizedInput(int id, int64_t m) const;

  // The gated activation that Run held back (GemmResidualFolds::hold_activation), run now: with
  // `id` >= 0, into the quantized input of FP8 projection `id` at the activation's rows (which
  // QuantizedInput must give; then Run `id` with input_quantized), else as asked (act's bf16
  // rows). Nothing where none is held. Run refuses any product while one is held.
  absl::Status RunHeldActivation(int id = -1);
  // Forgets a held activation (a step that failed before running it).
  void DropHeldActivation() { held_activation_.reset(); }

  // Whether a product of n outputs and k inputs (not the LM head) runs the skinny kernel at one
  // row: untimed there, it does unless every GEMM is cuBLASLt's or its shape is not the skinny
  // kernel's.
  bool SkinnyAtOneRow(int64_t n, int64_t k) const;

  // Whether projection `id`'s `layer`th product at one row runs the 16-bit or the FP8 skinny
  // kernel, or GGUF blocks' integer products (quant_gemm.h, every segment; not the LM head),
  // which take GemmResidualFolds (settle_residual not with an activation).
  bool FoldsAtOneRow(int id, int64_t layer) const;

  // The skinny kernel's L2 prefetch before its wait (SkinnyGemmParams::l2_prefetch_bytes), in
  // every product it runs in steps from now on; 0: none.
  void set_l2_prefetch_bytes(int64_t bytes) { l2_prefetch_bytes_ = bytes; }
  // Whether the skinny kernel may split k at one row (SkinnyGemmParams::k_split 0, else 1).
  void set_split_k(bool split) { split_k_ = split; }
  // Whether products of more than kMinTunedGemmRows rows are tuned on their first step's
  // operands (above).
  void set_tune_large(bool tune) { tune_large_ = tune; }
  // Whether a gated product (16-bit weights) of at least kMinSm90GatedRows rows runs the Hopper
  // GEMM with the activation in its epilogue (kernels/cuda/gemm_sm90.h), where the device runs
  // it, the kernels take the Hopper path (UseHopperKernels) and the shape suits it, instead of
  // cuBLASLt followed by the SiLU-and-mul kernel.
  void set_sm90_gated(bool on) { sm90_gated_ = on; }
  // The gated products run so (enqueued) since the selector was created.
  int64_t sm90_gated_runs() const { return sm90_gated_runs_; }

  // The plan of projection `id` at m rows, created on first use.
  absl::StatusOr<const kernels::cuda::GemmPlan*> Plan(int id, int64_t m);

 private:
  enum class Kernel { kBlas, kSkinny };
  // The kernel for projection `id` at m <= kMaxSkinnyGemmRows rows.
  absl::StatusOr<Kernel> Choose(int id, const kernels::cuda::GemmPlan& plan, const void* x, void* y,
                                void* act, kernels::GateActivation activation);
  // Settles the algorithm of a plan of more than kMinTunedGemmRows rows on its first run (the
  // bucket's tuned algorithm, or tuning on x, w, y). A no-op while capturing.
  absl::Status SettleLarge(int id, kernels::cuda::GemmPlan* plan, const void* x, const void* w,
                           void* y);

  // The fastest of `candidates` (each a pass over a projection's layers; rounds of each in turn,
  // the median kept; a tie goes to the later one). REQUIRES: not capturing.
  absl::StatusOr<Kernel> Fastest(
      const std::vector<std::pair<Kernel, std::function<void()>>>& candidates,
      const std::string& kind);
  // Run() of an FP8 projection, its kernel choice at up to kMaxSkinnyGemmRows rows, and its
  // cuBLASLt path (x quantized per token into the FP8 workspace, then the FP8 GEMM).
  absl::Status RunF8(int id, int64_t layer, int64_t m, const void* x, void* y, void* act,
                     bool late_dependents, kernels::GateActivation activation,
                     F8OutputScales* unscaled = nullptr,
                     const GemmResidualFolds* folds = nullptr);
  absl::StatusOr<Kernel> ChooseF8(int id, int64_t m, const void* x, void* y, void* act,
                                  kernels::GateActivation activation);
  // `input_quantized`: x's rows are already in the quantized input's scratch (QuantizedInput).
  // `hold_activation`: GemmResidualFolds::hold_activation.
  absl::Status RunF8Blas(int id, int64_t layer, int64_t m, const void* x, void* y, void* act,
                         kernels::GateActivation activation, F8OutputScales* unscaled = nullptr,
                         bool input_quantized = false, bool hold_activation = false);

  // Run() of a weight held in GGUF blocks.
  absl::Status RunBlocks(int id, int64_t layer, int64_t m, const void* x, void* y, void* act,
                         bool late_dependents, kernels::GateActivation activation,
                         const GemmResidualFolds* folds);
  bool HeldInBlocks(const GemmProjection& projection, size_t layer) const {
    return layer < projection.blocks.size() && !projection.blocks[layer].empty();
  }

  // act = activation(gate) * up of the [gate; up] rows `gate_up` of projection's output, m rows:
  // the kernel that follows cuBLASLt where the skinny GEMM's epilogue does not.
  kernels::cuda::SiluAndMulParams SiluAndMul(const GemmProjection& projection, int64_t m,
                                             const void* gate_up, void* act,
                                             kernels::GateActivation activation) const;

  const cublasLtHandle_t blas_;
  void* const workspace_;
  const size_t workspace_bytes_;
  const cudaStream_t stream_;
  const kernels::DType dtype_;
  const DecodeGemm choice_;
  bool autotune_ = false;
  void* f8_x_ = nullptr;
  float* f8_x_scales_ = nullptr;
  std::optional<kernels::cuda::SiluAndMulParams> held_activation_;  // RunHeldActivation's
  int64_t f8_max_rows_ = 0, f8_max_cols_ = 0;
  void* dequant_ = nullptr;
  int64_t dequant_bytes_ = 0;
  int64_t l2_prefetch_bytes_ = 0;
  bool split_k_ = true;
  bool tune_large_ = false;
  bool sm90_gated_ = false;
  int64_t sm90_gated_runs_ = 0;
  std::vector<GemmProjection> projections_;
  std::map<std::pair<int, int64_t>, std::unique_ptr<kernels::cuda::GemmPlan>> plans_;
  std::map<std::pair<int, int64_t>, Kernel> kernels_;
  // Plans of more than kMinTunedGemmRows rows whose algorithm is settled, by (id, m); the tuned
  // algorithm of each (id, bucket).
  std::map<std::pair<int, int64_t>, bool> settled_;
  std::map<std::pair<int, int64_t>, cublasLtMatmulAlgo_t> tuned_;
};

}  // namespace lmserve::engine::cuda

#endif  // LMSERVE_ENGINE_RUNNER_CUDA_GEMM_SELECTOR_H_
