#include "engine/runner/cuda_runner.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "common/status.h"
#include "common/strings.h"
#include "engine/model/kv_cache_groups.h"
#include "engine/model/ops.h"
#include "engine/runner/communicator.h"
#include "engine/runner/cuda/cuda_buffer.h"
#include "engine/runner/cuda/cuda_weights.h"
#include "engine/runner/cuda/decode_graphs.h"
#include "engine/runner/cuda/gemm_selector.h"
#include "engine/runner/cuda/step_inputs.h"
#include "engine/runner/memory_plan.h"
#include "engine/runner/weight_loader.h"
#include "kernels/cpu/qkv_postprocess.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/paged_attention_f32.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/qkv_postprocess.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/cuda/ssm.h"
#include "kernels/cuda/token_bitmask.h"

namespace lmserve::engine {
namespace {

namespace kc = kernels::cuda;
using cuda::CudaBuffer;
using cuda::StepLayout;
using kernels::DType;

constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;

// Logits rows computed at once (more rows, as teacher-forced scoring asks, go in chunks).
constexpr int64_t kMinLogitsChunkRows = 256;
// GPU memory kept free beyond the weights, workspaces and KV pool: CUDA graphs, cuBLAS's own
// allocations, the CUDA context's growth.
constexpr int64_t kReserveBytes = int64_t{512} << 20;

// The widest input of the matrices an FP8 runner holds in FP8 (cuda::IsF8Linear): the row of its
// per-token quantized inputs.
int64_t MaxF8Columns(const WeightPlan& plan) {
  int64_t columns = 16;
  for (const WeightSpec& spec : plan.specs()) {
    if (cuda::IsF8Linear(spec)) columns = std::max(columns, spec.cols);
  }
  return columns;
}
// The ops that take Buffer::kResidual in fp32 beside bf16 activations (ops.h allows no others).
constexpr const char* kResidualOnlyThere =
    "CUDA runner: the fp32 residual stream is only Embed's output, RmsNorm's input and the "
    "residual of AddRmsNorm and FinalNorm";

// The step being enqueued: what the ops read besides the model's weights.
struct Step {
  const StepLayout* layout = nullptr;  // inputs, already on the device
  int64_t tokens = 0;                  // rows of the activations (padded decode steps included)
  int64_t seqs = 0;
  int64_t rows = 0;              // logits rows
  bool decode_only = false;      // one token a sequence: decode attention, graphs
  bool rows_are_tokens = false;  // logits row r is token r: no gather before the LM head
};

class CudaRunner final : public ModelRunner, private ForwardOps {
 public:
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(
      std::unique_ptr<const ModelDescription> model, const Checkpoint& checkpoint,
      const RunnerConfig& config);
  ~CudaRunner() override;

  const ModelConfig& model_config() const override { return config_; }
  Backend backend() const override { return Backend::kCuda; }
  int32_t block_size_tokens() const override { return block_size_; }
  int32_t num_kv_blocks() const override { return num_blocks_; }
  std::vector<int32_t> kv_group_windows() const override { return groups_.windows; }
  bool samples_on_device() const override { return true; }
  int32_t num_state_slots() const override { return num_state_slots_; }
  bool samples_with_token_bitmask() const override {
    return runner_config_.device_token_bitmask;
  }
  RunnerStats stats() const override;

  absl::Status Execute(const StepBatch& batch, StepOutput* output) override;
  // Launch uploads the step's inputs and enqueues the forward pass, the first chunk of logits and
  // its draw (a decode graph's replay, or eagerly). A decode graph's draw, masked or not, waits on
  // the device for the step's masks (the gated token bitmask, kernels/cuda/token_bitmask.h); an
  // eager step with masked rows leaves its draw to Finish. Finish writes the masks into pinned
  // memory, copies them to the device and releases them, enqueues an eager masked step's draw
  // (the plain token bitmask), any further logits chunks and the copies back, and waits for the
  // stream. Every path out of a launched masked step releases its masks: Finish, a failed
  // Launch, the next Launch without a Finish (abandoned), and the destructor; and the device's
  // wait is bounded (device_mask_wait_seconds).
  absl::Status Launch(const StepBatch& batch, StepOutput* output) override;
  absl::Status Finish() override;
  bool CanLaunchAhead() const override;

 private:
  CudaRunner(std::unique_ptr<const ModelDescription> model, const RunnerConfig& runner_config);

  absl::Status Init(const Checkpoint& checkpoint);
  absl::Status AllocateWorkspaces();
  absl::Status AllocateKvPool();
  absl::Status CaptureGraphs();

  // Enqueues the model's forward pass for `step` (the first chunk of logits rows included).
  absl::Status Forward(const Step& step);
  // Logits rows [first_row, first_row + num_rows) into logits_, from the final norm's rows.
  absl::Status LogitsChunk(int64_t first_row, int64_t num_rows);
  // How a draw masks its rows: not at all; the gated token bitmask (masked rows wait on the
  // device for the step's release: decode graphs); or the plain one, over masks already on the
  // device (or pinned) and released (eager steps, enqueued by Finish).
  enum class Masking { kNone, kGated, kReady };
  // The sampler over those rows; their tokens reach h_sampled_ when the stream gets there.
  // `copy`: also copies the tokens to HostSampled(). The Sample op's draw does not: the graphs
  // would hold the address of one host buffer; Launch copies after the forward pass.
  absl::Status SampleRows(int64_t first_row, int64_t num_rows, Masking masking, bool copy = true);
  // Releases the launched masked step's masks (mask_step_) to the device; `abandoned`: the step
  // is given up, its rows not masked. Clears masks_pending_.
  void ReleaseMasks(bool abandoned);

  // ForwardOps, over step_.
  absl::Status Embed(Weight table, float scale) override;
  absl::Status RmsNorm(Buffer in, Weight weight, float epsilon, Buffer out) override;
  absl::Status AddRmsNorm(Buffer residual, Buffer add, Weight weight, float epsilon,
                          Buffer out) override;
  absl::Status Linear(Weight weight, Buffer in, Buffer out) override;
  absl::Status GatedLinear(Weight gate_up, Activation act, Buffer in, Buffer out) override;
  absl::Status Moe(const MoeLayer& moe, Buffer in, Buffer out) override;
  absl::Status RotaryAndCacheWrite(const AttentionLayer& layer, Buffer qkv) override;
  absl::Status Attention(const AttentionLayer& layer, Buffer qkv, Buffer out) override;
  absl::Status SsmConv(const SsmLayer& layer, Buffer in, Buffer conv) override;
  absl::Status SsmScan(const SsmLayer& layer, Buffer in, Buffer conv, Buffer out) override;
  absl::Status GatedRmsNorm(const SsmLayer& layer, Buffer in, Buffer y, Buffer out) override;
  absl::Status FinalNorm(Buffer residual, Buffer add, Weight weight, float epsilon) override;
  absl::Status LmHead(Weight lm_head, float softcap) override;
  // The first logits chunk's draw: behind the gated token bitmask where gate_masks_ (captures);
  // none where draw_in_finish_.
  absl::Status Sample() override;

  // The GEMM projection of `weight`'s kind (registered on first use), and `weight`'s place in it.
  std::pair<int, int64_t> Projection(Weight weight, bool logits);
  // The projection of `weight`'s kind that adds into the fp32 residual (fp32 output).
  int ResidualProjection(Weight weight);
  // Whether Linear(weight, in, Buffer::kProjected) may be held back to add into the residual.
  bool FusesIntoResidual(Weight weight) const;
  // Linear as asked; and the held-back one, if any, run as asked (before any other op), and
  // unless `keep_scales`, the pending FP8 output scales applied (ApplyPendingScales).
  // `folds`: what the skinny kernel folds in (FoldsFor).
  absl::Status LinearNow(Weight weight, Buffer in, Buffer out,
                         const cuda::GemmResidualFolds* folds = nullptr);
  // Unless `keep_folds`, also the held-back add + RMSNorm run and the residual's debt settled
  // (FlushAddNorm, SettleResidual); the ops that touch neither the residual nor its addend
  // instead call CarryFolds with their buffers first.
  absl::Status FlushLinear(bool keep_scales = false, bool keep_folds = false);
  // AddRmsNorm as asked (never held back). `taken`: the FP8 scales pending for `add`, already
  // taken (HeldAddNorm::input_scales); else they are taken here. `f8_out`: the normed rows go
  // there quantized per token instead of to `out` (FusedAddRmsNormParams::f8_output).
  absl::Status AddRmsNormNow(Buffer residual, Buffer add, Weight weight, float epsilon, Buffer out,
                             const cuda::F8OutputScales* taken = nullptr,
                             const cuda::F8QuantizedInput* f8_out = nullptr);
  // The folded add + RMSNorm (RunnerConfig::fold_add_norm): whether AddRmsNorm may be held back
  // for the next product; the held-back one run as asked; the residual's debt added in by a
  // kernel of its own; both of those where an op's `buffers` name the residual or the addend.
  bool MayFoldAddNorm(Buffer residual, Buffer add, Buffer out) const;
  // The same for a step of more than kMaxSkinnyGemmRows tokens of an FP8 model: the next product
  // may take the norm's rows quantized per token by the norm itself (F8QuantizedInput).
  bool MayQuantizeAddNorm(Buffer residual, Buffer add, Buffer out) const;
  // Whether this step's FP8 products may take their input quantized by the kernel before them
  // (MayQuantizeAddNorm, MayHoldActivation): folds on, FP8, more than kMaxSkinnyGemmRows tokens,
  // one GPU, bf16.
  bool FoldsF8Quantization() const;
  absl::Status FlushAddNorm();
  absl::Status SettleResidual();
  absl::Status CarryFolds(std::initializer_list<Buffer> buffers);
  absl::Status CheckUnfolded(std::initializer_list<Buffer> reads) const;
  // What Linear(weight, *in, out) (or GatedLinear: `gated`) folds into its skinny GEMM at one
  // token: the held-back add + RMSNorm (if *in is its output; *in becomes its addend, the
  // product's x), the residual's debt (if `out` is the addend, not `gated`); what it cannot take
  // is run or settled first. *in may not be a folded norm's unwritten output (CheckUnfolded).
  // At more than kMaxSkinnyGemmRows tokens, an FP8 product reading the held-back norm's output
  // has the norm run now with its rows quantized for it (input_quantized).
  absl::StatusOr<cuda::GemmResidualFolds> FoldsFor(Weight weight, Buffer* in, Buffer out,
                                                   bool gated = false);
  // F8ScaleOutput over the product that pending_scales_ names, if any.
  absl::Status ApplyPendingScales();
  // The scales pending for `buffer`, taken by the op that reads it (null rows: none); scales
  // pending for another buffer are applied first.
  absl::StatusOr<cuda::F8OutputScales> TakeScales(Buffer buffer);
  // The fields that DecodeAttentionParams, PrefillAttentionParams and PagedAttentionF32Params
  // share, for `layer`'s cache and the step's `seqs` sequences.
  template <typename Params>
  Params PagedAttentionParams(const AttentionLayer& layer, Buffer qkv, Buffer out) const;
  // The same with the ragged batch's query starts and tokens (the prefill and float32 kernels).
  template <typename Params>
  Params RaggedAttentionParams(const AttentionLayer& layer, Buffer qkv, Buffer out) const;
  // The prefill kernel's part of a step: its sequences after the leading ones of one token
  // (StepLayout::one_token_prefix), which the decode kernel takes, as a batch of their own.
  kc::PrefillAttentionParams PrefillParams(const AttentionLayer& layer, Buffer qkv,
                                           Buffer out) const;
  // Any layer's: the tile plan depends only on the step's lengths.
  kc::PrefillAttentionParams PrefillPlanParams() const;

  template <typename T>
  const T* In(size_t offset) const {
    return inputs_.Device<T>(offset);
  }
  void* Buf(Buffer buffer) const { return buffers_[static_cast<int>(buffer)].get(); }
  // The element type of a buffer: kernel_dtype_, but residual_dtype_ for the residual stream.
  DType BufDType(Buffer buffer) const {
    return buffer == Buffer::kResidual ? residual_dtype_ : kernel_dtype_;
  }
  // A KV cache layer's keys and values: its slot of its group's blocks (kv_cache_groups.h).
  void* KeyCache(int64_t layer) const {
    return kv_pool_.at((2 * int64_t{groups_.layer_slot[layer]}) * layer_cache_bytes_);
  }
  void* ValueCache(int64_t layer) const {
    return kv_pool_.at((2 * int64_t{groups_.layer_slot[layer]} + 1) * layer_cache_bytes_);
  }
  int64_t Group(int64_t layer) const { return groups_.layer_group[static_cast<size_t>(layer)]; }
  // A state-space layer's states (kernels/cuda/ssm.h's layouts, fp32): the conv ring
  // [slots, kernel, conv_dim], then the SSM state [slots, heads, head_dim, state_size].
  float* ConvStates(int64_t state_layer) const {
    return state_pool_.as<float>() + state_layer * layer_state_floats_;
  }
  float* SsmStates(int64_t state_layer) const {
    return ConvStates(state_layer) +
           int64_t{num_state_slots_} * config_.ssm.conv_kernel * config_.ssm.conv_dim();
  }
  kc::SsmDeviceSequences SsmSequences() const {
    return {.query_start = In<int32_t>(step_.layout->query_start),
            .context_lens = In<int32_t>(step_.layout->context_lens),
            .state_slots = In<int32_t>(step_.layout->state_slots),
            .num_seqs = step_.seqs,
            .num_slots = num_state_slots_};
  }
  kc::SsmConvParams SsmConvParams(const SsmLayer& layer, Buffer in, Buffer conv) const;
  kc::SsmScanParams SsmScanParams(const SsmLayer& layer, Buffer in, Buffer conv,
                                  Buffer out) const;
  // Tensor parallelism: the sum over the ranks of the step's rows of `buffer` ([tokens, width]),
  // in place (a row-parallel projection's partial sums). A no-op for a whole model.
  absl::Status AllReduce(Buffer buffer, int64_t width);

  const std::unique_ptr<const ModelDescription> model_;
  const ModelConfig& config_;  // a rank's share under tensor parallelism
  const RunnerConfig runner_config_;
  Communicator* const comm_;   // null for a whole model
  bool collectives_ = true;    // off while the GEMMs are tuned (CaptureGraphs)
  const RunnerDType dtype_;      // resolved: kBFloat16 or kFloat32
  const DType kernel_dtype_;     // the kernels' name for it: kBF16 or kF32
  const int64_t element_bytes_;  // 2 or 4
  // Buffer::kResidual's type: kernel_dtype_, or kF32 in bf16 with RunnerConfig::fp32_residual.
  const DType residual_dtype_;
  const int32_t block_size_;
  const int64_t max_tokens_;  // tokens in a step, at most
  const int64_t max_seqs_;    // sequences in a step, at most
  int64_t max_table_ids_ = 0;
  int64_t logits_chunk_rows_ = 0;
  std::string device_name_;
  std::string cuda_kernels_;  // RunnerStats::cuda_kernels
  bool fp8_ = false;          // the linear layers in FP8 (RunnerQuantization, resolved)
  // The KV cache in FP8 E4M3 (KvCacheDType, resolved), with its scales by KV cache layer: the
  // checkpoint's (ReadKvCacheScales) or 1.0.
  bool kv_fp8_ = false;
  KvCacheScales kv_scales_;
  int64_t KvElementBytes() const { return kv_fp8_ ? 1 : element_bytes_; }
  // An attention kernel's FP8 cache fields for `layer` (none without an FP8 cache).
  template <typename Params>
  void SetKvScales(const AttentionLayer& layer, Params& params) const {
    if (!kv_fp8_) return;
    params.cache_fp8 = true;
    params.k_scale = kv_scales_.k[static_cast<size_t>(layer.layer)];
    params.v_scale = kv_scales_.v[static_cast<size_t>(layer.layer)];
  }
  CudaBuffer f8_inputs_;      // FP8 projections' per-token quantized inputs and their scales
  // GGUF blocks (cuda::ChooseBlockTypes, by Weight::index; empty: none), what RunnerStats
  // reports for them, and the scratch that larger steps dequantize such a weight into.
  cuda::BlockTypes block_types_;
  RunnerQuantization block_quantization_ = RunnerQuantization::kNone;
  int64_t dequant_scratch_bytes_ = 0;
  CudaBuffer dequant_scratch_;

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<kc::BlasLtHandle> blas_;
  CudaBuffer gemm_workspace_;
  std::unique_ptr<cuda::GemmSelector> gemms_;
  // The gated RMSNorm folded into the SSM decode kernel and out_proj (RunnerConfig::fuse_ssm_norm;
  // SsmScan says when): the partial sums of squares the decode kernel writes, one row, and the
  // norm's state between the three ops — set by SsmScan, handed on by GatedRmsNorm (which then
  // launches nothing), taken by the Linear that reads `out`.
  CudaBuffer ssm_norm_partials_;
  struct PendingSsmNorm {
    Buffer out;
    cuda::GemmNormEpilogue epilogue;
    bool gated = false;  // GatedRmsNorm has run
  };
  std::optional<PendingSsmNorm> pending_ssm_norm_;
  // A projection into Buffer::kProjected held back by Linear (RunnerConfig::fuse_residual_gemm,
  // FusesIntoResidual): if the next op is the add + RMSNorm of kProjected into the residual, the
  // GEMM adds itself to the fp32 residual in its epilogue and the norm reads the residual only;
  // any other op first runs it as asked (FlushLinear).
  struct DeferredLinear {
    Weight weight;
    Buffer in;
  };
  std::optional<DeferredLinear> deferred_linear_;
  // An add + RMSNorm of a step of one token held back by AddRmsNorm (RunnerConfig::fold_add_norm,
  // MayFoldAddNorm): if the next op is a Linear reading `out` that runs the skinny kernel, that
  // kernel adds and normalizes x itself (skinny_gemm.h, add_norm_residual) and the residual then
  // owes `add` (residual_debt_), which the next product writing `add` adds in before its wait
  // (settle_residual). Any other op first runs the norm as asked (FlushAddNorm), and any op that
  // names the residual or the addend first settles the debt with a kernel of its own.
  // MayQuantizeAddNorm holds one back the same way for an FP8 product of a larger step, which
  // then has it write the rows quantized for the product (FoldsFor).
  struct HeldAddNorm {
    Buffer residual, add, out;
    Weight weight;
    float epsilon = 0.0f;
    cuda::F8OutputScales input_scales;  // the FP8 scales pending for `add`, taken (rows null: none)
  };
  std::optional<HeldAddNorm> held_add_norm_;
  std::optional<HeldAddNorm> residual_debt_;
  // The output buffers of a folded add + RMSNorm or gated activation, never written: an op that
  // reads one before an op writes it again is refused (CheckUnfolded), not given stale rows. No
  // family does.
  std::vector<Buffer> folded_outs_;
  void MarkFolded(Buffer b) {
    if (std::find(folded_outs_.begin(), folded_outs_.end(), b) == folded_outs_.end()) {
      folded_outs_.push_back(b);
    }
  }
  void Unfold(Buffer b) { std::erase(folded_outs_, b); }
  // GatedLinear's output at a step of more than kMaxSkinnyGemmRows tokens of an FP8 model, whose
  // gated activation the GEMM selector holds back (GemmResidualFolds::hold_activation): if the
  // next op is a Linear reading it whose product quantizes its input, the activation writes that
  // quantized input instead (GemmSelector::RunHeldActivation); any other op first has it run as
  // asked (FlushAddNorm).
  std::optional<Buffer> held_activation_;
  bool MayHoldActivation(int gate_up_id, Buffer in, Buffer out) const;
  // An FP8 product that cuBLASLt left unscaled (GemmSelector::Run's `unscaled`): the op that
  // reads it next applies its scales as it reads (QKV post-processing for kQkv, the add +
  // RMSNorm for kProjected), or FlushLinear has F8ScaleOutput apply them first.
  struct PendingScales {
    Buffer buffer;
    cuda::F8OutputScales scales;
  };
  std::optional<PendingScales> pending_scales_;
  // By Weight::index, filled for a whole kind on its first GEMM: the kind's projection in gemms_
  // (-1 before), and the weight's place among its kind's.
  std::vector<int> weight_projection_;
  std::vector<int64_t> weight_layer_;
  // The same for the projections that add into the fp32 residual (fp32 output).
  std::vector<int> weight_residual_projection_;

  cuda::CudaWeights weights_;
  std::vector<CudaBuffer> cos_sin_;  // by rotary embedding: [max_position, head_dim] fp32

  // KV pool: for each layer slot of a block, keys then values, each [num_blocks, block_size,
  // kv_heads, head_dim]. A layer uses its slot, through its group's tables.
  const KvCacheGroups groups_;
  CudaBuffer kv_pool_;
  // Recurrent states of the state-space layers, one slot a sequence (max_num_seqs of them).
  CudaBuffer state_pool_;
  int32_t num_state_slots_ = 0;
  int64_t layer_state_floats_ = 0;
  int32_t num_blocks_ = 0;
  int64_t layer_cache_bytes_ = 0;

  cuda::StepInputs inputs_;

  // Activations (in the runner's dtype, the residual stream in residual_dtype_) and outputs.
  std::array<CudaBuffer, kNumBuffers> buffers_;  // by Buffer, [max_tokens, BufferWidth]
  CudaBuffer gate_up_;            // [max_tokens, 2 intermediate]: cuBLASLt's gate/up output
  CudaBuffer final_rows_;         // [max_tokens, hidden]: the logits rows' final norm, gathered
  CudaBuffer logits_;             // [logits_chunk_rows, vocab] fp32
  // Tensor parallelism: the rank's vocabulary slice of a logits chunk, [logits_chunk_rows,
  // slice] fp32, and every rank's, [ranks, logits_chunk_rows, slice].
  CudaBuffer rank_logits_, gathered_logits_;
  CudaBuffer sampled_;            // [max_tokens] int32
  CudaBuffer sampler_workspace_;  // kc::kSamplingWorkspaceBytes
  // [max_tokens] int32, pinned: two, a step's draws going to h_sampled_[h_sampled_index_], so
  // that a step left unfinished (async scheduling) keeps its tokens while the next one draws.
  CudaBuffer h_sampled_[2];
  int h_sampled_index_ = 0;
  int32_t* HostSampled() const { return h_sampled_[h_sampled_index_].as<int32_t>(); }
  // device_token_bitmask only: the step's masks, [max_seqs, ceil(vocab / 32)] uint32, on the
  // device and their pinned staging (Finish copies them on mask_stream_ and waits, then releases
  // them); the release word (at byte 0) and the timed-out and waited words (at bytes 64 and 72,
  // their own cache line), pinned, which the gated token bitmask reads and writes by their device
  // addresses (d_*); the wait's outcome for the masking kernel (mask_gate_, device memory).
  CudaBuffer token_bitmask_;
  CudaBuffer mask_gate_;  // [1] uint64: the gated token bitmask's wait outcome
  CudaBuffer h_token_bitmask_;
  CudaBuffer h_mask_sync_;
  cudaStream_t mask_stream_ = nullptr;
  const uint64_t* d_mask_release_ = nullptr;
  uint64_t* d_mask_timed_out_ = nullptr;
  const uint32_t* d_pinned_token_bitmask_ = nullptr;  // device_mask_read_pinned: the staging's
                                                      // device address
  // Byte 72, beside the timed-out word: how long the last masked step's draw waited (ns; every
  // masked step's draw writes it, after the release or at its timeout).
  uint64_t* d_mask_waited_ns_ = nullptr;
  uint64_t* mask_release() const { return h_mask_sync_.as<uint64_t>(); }
  const uint64_t* mask_timed_out() const { return h_mask_sync_.at<const uint64_t>(64); }
  const uint64_t* mask_waited_ns() const { return h_mask_sync_.at<const uint64_t>(72); }
  uint64_t mask_step_ = 0;      // the last masked step's number (released in order: 1, 2, ...)
  bool masks_pending_ = false;  // a masked step is launched and its masks not yet released
  CudaBuffer decode_workspace_;
  CudaBuffer prefill_workspace_;
  CudaBuffer moe_workspace_;  // kc::MoeParams::WorkspaceBytes; models with experts only
  std::map<int64_t, int> decode_splits_;  // batch size -> DecodeAttentionParams max_splits
  int64_t num_split_attention_steps_ = 0;  // RunnerStats::num_split_attention_steps
  int64_t num_folded_add_norms_ = 0;       // RunnerStats::num_folded_add_norms

  // Decode graphs: the whole step, the draw included, behind the gated token bitmask where
  // device_token_bitmask (a step with masked rows replays the same graph as any other).
  cuda::DecodeGraphs graphs_;
  bool gate_masks_ = false;  // the Sample op enqueues the gated token bitmask (captures)
  // An eager step with masked rows: the Sample op enqueues nothing, Finish enqueues the draw once
  // the masks are on the device. (Eager draws behind the gated bitmask, its two plain launches
  // among the step's programmatic ones, left the decode graphs replayed after them ~10% slower
  // on an H100 until the next eager step without them: bench/results 15.)
  bool draw_in_finish_ = false;

  // The step being enqueued, for the ops; between Launch and Finish, the launched step (its
  // batch, output and inputs' layout).
  Step step_;
  StepLayout layout_;
  const StepBatch* launched_batch_ = nullptr;
  StepOutput* launched_output_ = nullptr;
  // Async scheduling (CanLaunchAhead): a step launched before the one launched last and not yet
  // finished. Its Finish waits for `done` and reads its draws.
  struct AheadStep {
    StepOutput* output = nullptr;
    std::vector<std::pair<int32_t, int32_t>> sampled;  // (logits row, sequence)
    int h_sampled_index = 0;
  };
  std::optional<AheadStep> ahead_;
  cudaEvent_t ahead_done_event_ = nullptr;
  // For the step being launched: the logits row of each sequence of the step launched before it
  // (-1 where it draws nothing), which its pending tokens name.
  std::vector<int32_t> launched_rows_;
  const void* final_rows_source_ = nullptr;  // the final norm's rows: normed or gathered
  Weight lm_head_;                           // the last LmHead op's weights
  float logit_softcap_ = 0;                  // and its soft-cap
  double startup_seconds_ = 0;
  int64_t num_graph_replays_ = 0;  // RunnerStats::num_graph_replays
  // RunnerStats' structured-output and device-time counters.
  int64_t num_masked_steps_ = 0;
  double mask_upload_seconds_ = 0.0;
  double mask_wait_seconds_ = 0.0;
  // time_device_steps: events around the launched step's work on stream_.
  cudaEvent_t step_start_event_ = nullptr;
  cudaEvent_t step_end_event_ = nullptr;
  int64_t num_timed_device_steps_ = 0;
  double device_step_seconds_ = 0.0;
};

CudaRunner::CudaRunner(std::unique_ptr<const ModelDescription> model,
                       const RunnerConfig& runner_config)
    : model_(std::move(model)),
      config_(model_->config()),
      runner_config_(runner_config),
      comm_(runner_config.communicator),
      dtype_(ResolveRunnerDType(runner_config.dtype, Backend::kCuda)),
      kernel_dtype_(dtype_ == RunnerDType::kFloat32 ? DType::kF32 : DType::kBF16),
      element_bytes_(RunnerDTypeBytes(dtype_)),
      residual_dtype_(runner_config.fp32_residual ? DType::kF32 : kernel_dtype_),
      block_size_(runner_config.block_size_tokens),
      max_tokens_(
          std::max<int64_t>(runner_config.max_num_batched_tokens, runner_config.max_num_seqs)),
      max_seqs_(runner_config.max_num_seqs),
      weight_projection_(static_cast<size_t>(model_->weights().size()), -1),
      weight_layer_(static_cast<size_t>(model_->weights().size()), -1),
      weight_residual_projection_(static_cast<size_t>(model_->weights().size()), -1),
      groups_(PlanKvCacheGroups(model_->kv_windows())) {}

CudaRunner::~CudaRunner() {
  cudaSetDevice(runner_config_.device);
  // A launched masked step never finished: its draw must not wait for masks that will not come.
  if (masks_pending_) ReleaseMasks(/*abandoned=*/true);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  gemms_.reset();
  blas_.reset();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (mask_stream_ != nullptr) cudaStreamDestroy(mask_stream_);
  if (step_start_event_ != nullptr) cudaEventDestroy(step_start_event_);
  if (step_end_event_ != nullptr) cudaEventDestroy(step_end_event_);
  if (ahead_done_event_ != nullptr) cudaEventDestroy(ahead_done_event_);
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CudaRunner::Create(
    std::unique_ptr<const ModelDescription> model_description, const Checkpoint& checkpoint,
    const RunnerConfig& config) {
  const auto start = std::chrono::steady_clock::now();
  const ModelConfig& model = model_description->config();
  if (config.block_size_tokens <= 0 || config.kv_cache_bytes < 0 || config.max_num_seqs <= 0 ||
      config.max_num_batched_tokens <= 0 || !(config.gpu_memory_utilization > 0.0) ||
      config.gpu_memory_utilization > 1.0 || !(config.device_mask_wait_seconds > 0.0) ||
      config.device_mask_wait_seconds > 1e6) {
    return absl::InvalidArgumentError(
        StrCat("runner config: block_size_tokens (", config.block_size_tokens, "), max_num_seqs (",
               config.max_num_seqs, ") and max_num_batched_tokens (", config.max_num_batched_tokens,
               ") must be positive, kv_cache_bytes (", config.kv_cache_bytes,
               ") non-negative, gpu_memory_utilization (", config.gpu_memory_utilization,
               ") in (0, 1] and device_mask_wait_seconds (", config.device_mask_wait_seconds,
               ") in (0, 1e6]"));
  }
  const RunnerDType dtype = ResolveRunnerDType(config.dtype, Backend::kCuda);
  if (dtype != RunnerDType::kBFloat16 && dtype != RunnerDType::kFloat32) {
    return absl::InvalidArgumentError(StrCat("CUDA runner: dtype ", RunnerDTypeName(dtype),
                                             " is not supported (auto, bfloat16 or float32)"));
  }
  LMSERVE_RETURN_IF_ERROR(CheckCudaRunnerDevice(config.device));
  cudaDeviceProp prop{};
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&prop, config.device),
                               "cudaGetDeviceProperties");
  // FP8 linear layers: asked for, or an FP8 checkpoint under kAuto where the GPU and dtype can
  // serve it (else it is dequantized at load).
  const bool fp8_capable = kc::SupportsFp8(prop.major, prop.minor);
  if (config.quantization == RunnerQuantization::kFp8) {
    if (!fp8_capable) {
      return absl::FailedPreconditionError(
          StrCat("CUDA runner: --quantization fp8 needs a GPU of compute capability 8.9 or newer "
                 "(Ada, Hopper); ",
                 prop.name, " is ", prop.major, ".", prop.minor));
    }
    if (dtype != RunnerDType::kBFloat16) {
      return absl::InvalidArgumentError(
          StrCat("CUDA runner: --quantization fp8 needs --dtype bfloat16 (or auto), not ",
                 RunnerDTypeName(dtype)));
    }
  }
  const bool fp8 = config.quantization == RunnerQuantization::kFp8 ||
                   (config.quantization == RunnerQuantization::kAuto && model.fp8.present &&
                    fp8_capable && dtype == RunnerDType::kBFloat16);
  // GGUF blocks: dummy weights of a block type, or a GGUF checkpoint's blocks (kAuto, kGguf).
  const bool dummy_blocks = RunnerQuantizationBlockType(config.quantization).has_value();
  if (dummy_blocks && config.load_format != LoadFormat::kDummy) {
    return absl::InvalidArgumentError(StrCat(
        "CUDA runner: --quantization ", RunnerQuantizationName(config.quantization),
        " makes dummy weights (--load-format dummy); a GGUF checkpoint's blocks are kept with "
        "--quantization auto or gguf"));
  }
  if ((dummy_blocks || config.quantization == RunnerQuantization::kGguf) &&
      dtype != RunnerDType::kBFloat16) {
    return absl::InvalidArgumentError(
        StrCat("CUDA runner: --quantization ", RunnerQuantizationName(config.quantization),
               " needs --dtype bfloat16 (or auto), not ", RunnerDTypeName(dtype)));
  }
  cuda::BlockTypes block_types;
  if (!fp8 && dtype == RunnerDType::kBFloat16) {
    block_types = cuda::ChooseBlockTypes(model_description->weights(), checkpoint,
                                         config.quantization, config.load_format);
  }
  int64_t dequant_scratch_bytes = 0;
  for (size_t i = 0; i < block_types.size(); ++i) {
    if (block_types[i].empty()) continue;
    const WeightSpec& spec = model_description->weights().specs()[i];
    dequant_scratch_bytes =
        std::max(dequant_scratch_bytes, (spec.rows * spec.cols * 2 + 255) / 256 * 256);
  }
  if (dequant_scratch_bytes == 0) block_types.clear();
  // The KV cache's type: FP8 only where asked for, in bf16, on 8.9+.
  if (config.kv_cache_dtype != KvCacheDType::kAuto && dtype != RunnerDType::kBFloat16) {
    return absl::InvalidArgumentError(
        StrCat("CUDA runner: --kv-cache-dtype ", KvCacheDTypeName(config.kv_cache_dtype),
               " needs --dtype bfloat16 (or auto), not ", RunnerDTypeName(dtype),
               " (in float32 the KV cache is float32: --kv-cache-dtype auto)"));
  }
  const bool kv_fp8 = config.kv_cache_dtype == KvCacheDType::kFp8;
  if (kv_fp8 && !fp8_capable) {
    return absl::FailedPreconditionError(
        StrCat("CUDA runner: --kv-cache-dtype fp8 needs a GPU of compute capability 8.9 or newer "
               "(Ada, Hopper); ",
               prop.name, " is ", prop.major, ".", prop.minor));
  }
  if (kv_fp8 && model.head_dim == 256 && prop.major < 9) {
    // The prefill kernel's FP8 staging tiles do not fit beside its 16-bit ones in sm_89's 99 KB.
    return absl::UnimplementedError(
        StrCat("CUDA runner: --kv-cache-dtype fp8 at head_dim 256 needs compute capability 9.0 "
               "(the prefill kernel's shared memory); ",
               prop.name, " is ", prop.major, ".", prop.minor));
  }
  if (model.ssm.num_heads > 0) {
    const SsmConfig& ssm = model.ssm;
    if (!kc::SupportsSsmStateSize(ssm.state_size) || ssm.head_dim % 8 != 0 ||
        ssm.head_dim > kc::kSsmMaxHeadDim || ssm.conv_kernel < 2 ||
        ssm.conv_kernel > kc::kSsmMaxConvKernel || ssm.in_proj_dim() % 8 != 0 ||
        ssm.conv_dim() % 8 != 0) {
      return absl::UnimplementedError(StrCat(
          "CUDA runner: state-space layers of head_dim ", ssm.head_dim, ", state ",
          ssm.state_size, ", conv kernel ", ssm.conv_kernel, " and in_proj width ",
          ssm.in_proj_dim(), " are not supported (head_dim a multiple of 8, at most ",
          kc::kSsmMaxHeadDim, "; state 16, 32, 64, 128 or 256; kernel 2 to ",
          kc::kSsmMaxConvKernel, "; widths multiples of 8)"));
    }
  }
  if (HasAttentionLayers(model) && !kc::SupportsHeadDim(model.head_dim)) {
    return absl::UnimplementedError(StrCat("CUDA runner: head_dim ", model.head_dim,
                                           " is not supported (", kc::kHeadDimList, ")"));
  }
  if (model.hidden_size % 8 != 0 || model.intermediate_size % 8 != 0 ||
      model.vocab_size % 8 != 0 || VocabShardRows(model) % 8 != 0) {
    return absl::UnimplementedError(StrCat(
        "CUDA runner: hidden (", model.hidden_size, "), intermediate (", model.intermediate_size,
        ") and vocabulary (", model.vocab_size, ", ", VocabShardRows(model),
        " a rank) sizes must be multiples of 8"));
  }
  if (model.num_experts > 0 &&
      (model.moe_intermediate_size % 8 != 0 || model.num_experts > kc::kMaxCudaMoeExperts ||
       model.num_experts_per_tok > kc::kMaxCudaMoeTopK)) {
    return absl::UnimplementedError(
        StrCat("CUDA runner: ", model.num_experts, " experts of intermediate size ",
               model.moe_intermediate_size, ", ", model.num_experts_per_tok,
               " per token are not supported (a multiple of 8; at most ", kc::kMaxCudaMoeExperts,
               " experts and ", kc::kMaxCudaMoeTopK, " per token)"));
  }
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaSetDevice(config.device), "cudaSetDevice");
  {
    // The memory plan, before anything is allocated (memory_plan.h): weights at the element
    // size; the activations of the largest step (at 4 bytes an element, a bound for bf16 too),
    // the logits chunk and the GEMM workspace; the KV pool (--kv-cache-mb) or at least one block.
    // Against what --gpu-memory-utilization leaves of the free memory, as AllocateKvPool counts.
    size_t free_bytes = 0, total_bytes = 0;
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    const int64_t max_tokens =
        std::max<int64_t>(config.max_num_batched_tokens, config.max_num_seqs);
    int64_t activation_elements = 2 * model.intermediate_size + model.hidden_size;
    for (int b = 0; b < kNumBuffers; ++b) {
      activation_elements += BufferWidth(static_cast<Buffer>(b), model);
    }
    const int64_t logits_rows =
        std::min<int64_t>(std::max<int64_t>(config.max_num_seqs, kMinLogitsChunkRows), max_tokens);
    MemoryPlan plan;
    plan.device = StrCat("GPU memory (", prop.name, ")");
    plan.weight_bytes = cuda::CudaWeights::Bytes(
        model_description->weights(), dtype == RunnerDType::kFloat32 ? DType::kF32 : DType::kBF16,
        fp8, block_types);
    int64_t f8_input_bytes = 0;
    if (fp8) f8_input_bytes = max_tokens * (MaxF8Columns(model_description->weights()) + 4) + 512;
    plan.workspace_bytes =
        f8_input_bytes + dequant_scratch_bytes + max_tokens * activation_elements * 4 +
        logits_rows * model.vocab_size * 4 + static_cast<int64_t>(kGemmWorkspaceBytes);
    plan.kv_cache_bytes =
        config.kv_cache_bytes > 0
            ? config.kv_cache_bytes
            : CudaKvBlockBytes(model, config.block_size_tokens, dtype, config.kv_cache_dtype);
    plan.state_bytes = int64_t{config.max_num_seqs} * CudaStateSlotBytes(model);
    plan.available_bytes = static_cast<int64_t>(free_bytes) -
                           static_cast<int64_t>((1.0 - config.gpu_memory_utilization) *
                                                static_cast<double>(total_bytes)) -
                           kReserveBytes;
    plan.available_source = StrCat(
        FormatBytes(static_cast<int64_t>(free_bytes)), " free of ",
        FormatBytes(static_cast<int64_t>(total_bytes)),
        " (cudaMemGetInfo), less what --gpu-memory-utilization ", config.gpu_memory_utilization,
        " leaves out and ", FormatBytes(kReserveBytes), " kept for CUDA graphs and libraries");
    LMSERVE_RETURN_IF_ERROR(
        CheckMemoryPlan(plan,
                        "a smaller --max-num-batched-tokens or --kv-cache-mb, a higher "
                        "--gpu-memory-utilization, or a smaller model may fit"));
  }
  // Both process-wide (the last runner created sets them). The portable path is what a GPU below
  // Hopper runs: no programmatic dependent launch either.
  kc::SetKernelPath(config.cuda_kernel_path == CudaKernelPath::kPortable ? kc::KernelPath::kPortable
                                                                         : kc::KernelPath::kAuto);
  kc::AllowProgrammaticLaunch(config.programmatic_launch);
  std::unique_ptr<CudaRunner> runner(new CudaRunner(std::move(model_description), config));
  runner->device_name_ = prop.name;
  runner->fp8_ = fp8;
  if (!block_types.empty()) {
    runner->block_quantization_ = dummy_blocks ? config.quantization : RunnerQuantization::kGguf;
  }
  runner->block_types_ = std::move(block_types);
  runner->dequant_scratch_bytes_ = dequant_scratch_bytes;
  runner->kv_fp8_ = kv_fp8;
  {
    const int code = kc::KernelCodeCapability(config.device);
    runner->cuda_kernels_ =
        StrCat(kc::UseHopperKernels() ? "Hopper" : "portable", " kernels (sm_", code, " code",
               kc::ProgrammaticLaunchEnabled() ? ", PDL" : "", ")");
  }
  LMSERVE_RETURN_IF_ERROR(runner->Init(checkpoint));
  runner->startup_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

absl::Status CudaRunner::Init(const Checkpoint& checkpoint) {
  if (kv_fp8_) {
    // A KV cache layer is its decoder layer where every layer attends; a hybrid's (state-space
    // layers beside attention) keep 1.0.
    const int64_t kv_layers = static_cast<int64_t>(model_->kv_windows().size());
    if (config_.ssm.num_heads > 0) {
      kv_scales_.k.assign(static_cast<size_t>(kv_layers), 1.0f);
      kv_scales_.v.assign(static_cast<size_t>(kv_layers), 1.0f);
    } else {
      LMSERVE_ASSIGN_OR_RETURN(kv_scales_, ReadKvCacheScales(checkpoint, kv_layers));
    }
  }
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                               "cudaStreamCreate");
  LMSERVE_ASSIGN_OR_RETURN(blas_, kc::BlasLtHandle::Create());
  LMSERVE_ASSIGN_OR_RETURN(gemm_workspace_,
                           CudaBuffer::Device(kGemmWorkspaceBytes, "the GEMM workspace"));
  gemms_ =
      std::make_unique<cuda::GemmSelector>(blas_->get(), gemm_workspace_.get(), kGemmWorkspaceBytes,
                                           stream_, kernel_dtype_, runner_config_.decode_gemm);
  gemms_->set_l2_prefetch_bytes(runner_config_.skinny_l2_prefetch_bytes);
  gemms_->set_split_k(runner_config_.skinny_split_k);
  gemms_->set_tune_large(runner_config_.tune_prefill_gemms);
  gemms_->set_sm90_gated(runner_config_.sm90_gated_gemm);

  // Weights, then the rotary tables (fp32, every position the model takes).
  LMSERVE_ASSIGN_OR_RETURN(weights_, cuda::CudaWeights::Allocate(model_->weights(), kernel_dtype_,
                                                                 fp8_, block_types_, stream_));
  LMSERVE_RETURN_IF_ERROR(
      LoadWeights(model_->weights(), checkpoint, runner_config_.load_format, weights_));
  for (const RopeConfig& rope : model_->rotary()) {
    const std::vector<double> inv_freq = RopeInverseFrequencies(rope, config_.head_dim);
    const std::vector<float> table =
        kernels::RotaryCosSinTable(inv_freq.data(), RotaryDim(rope, config_.head_dim),
                                   config_.max_position_embeddings, rope.attention_factor);
    const int64_t bytes = static_cast<int64_t>(table.size() * sizeof(float));
    LMSERVE_ASSIGN_OR_RETURN(CudaBuffer device, CudaBuffer::Device(bytes, "the rotary table"));
    LMSERVE_RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(device.get(), table.data(), static_cast<size_t>(bytes),
                        cudaMemcpyHostToDevice, stream_),
        "uploading the rotary table");
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "uploading the rotary table");
    cos_sin_.push_back(std::move(device));
  }
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "loading the weights");

  LMSERVE_RETURN_IF_ERROR(AllocateWorkspaces());
  LMSERVE_RETURN_IF_ERROR(AllocateKvPool());
  if (runner_config_.cuda_graphs) LMSERVE_RETURN_IF_ERROR(CaptureGraphs());
  return absl::OkStatus();
}

absl::Status CudaRunner::AllocateWorkspaces() {
  const ModelConfig& c = config_;
  const int64_t t = max_tokens_;
  const int64_t e = element_bytes_;
  for (int b = 0; b < kNumBuffers; ++b) {
    const Buffer buffer = static_cast<Buffer>(b);
    const int64_t bytes = BufDType(buffer) == DType::kF32 ? 4 : e;
    LMSERVE_ASSIGN_OR_RETURN(buffers_[b],
                             CudaBuffer::Device(t * BufferWidth(buffer, c) * bytes, "activations"));
  }
  LMSERVE_ASSIGN_OR_RETURN(gate_up_,
                           CudaBuffer::Device(t * 2 * c.intermediate_size * e, "activations"));
  LMSERVE_ASSIGN_OR_RETURN(final_rows_, CudaBuffer::Device(t * c.hidden_size * e, "activations"));
  logits_chunk_rows_ = std::max<int64_t>(max_seqs_, kMinLogitsChunkRows);
  logits_chunk_rows_ = std::min<int64_t>(logits_chunk_rows_, t);
  LMSERVE_ASSIGN_OR_RETURN(
      logits_,
      CudaBuffer::Device(logits_chunk_rows_ * c.vocab_size * int64_t{sizeof(float)}, "logits"));
  if (comm_ != nullptr) {
    const int64_t slice_bytes = logits_chunk_rows_ * VocabShardRows(c) * int64_t{sizeof(float)};
    LMSERVE_ASSIGN_OR_RETURN(rank_logits_, CudaBuffer::Device(slice_bytes, "logits"));
    LMSERVE_ASSIGN_OR_RETURN(gathered_logits_,
                             CudaBuffer::Device(comm_->size() * slice_bytes, "logits"));
  }
  if (fp8_) {  // the FP8 projections' quantized inputs [t, widest k] and scales [t]
    const int64_t columns = MaxF8Columns(model_->weights());
    const int64_t x_bytes = (t * columns + 255) / 256 * 256;
    LMSERVE_ASSIGN_OR_RETURN(f8_inputs_,
                             CudaBuffer::Device(x_bytes + t * 4, "FP8 GEMM inputs"));
    gemms_->SetF8Workspace(f8_inputs_.get(), f8_inputs_.at<float>(x_bytes), t,
                           columns);
  }
  if (dequant_scratch_bytes_ > 0) {  // weights in GGUF blocks, dequantized for larger steps
    LMSERVE_ASSIGN_OR_RETURN(dequant_scratch_,
                             CudaBuffer::Device(dequant_scratch_bytes_, "the dequantized weight"));
    gemms_->SetDequantWorkspace(dequant_scratch_.get(), dequant_scratch_bytes_);
  }
  LMSERVE_ASSIGN_OR_RETURN(sampled_, CudaBuffer::Device(t * 4, "sampled tokens"));
  LMSERVE_ASSIGN_OR_RETURN(sampler_workspace_,
                           CudaBuffer::Device(kc::kSamplingWorkspaceBytes, "the sampler"));
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaMemset(sampler_workspace_.get(), 0, kc::kSamplingWorkspaceBytes),
                               "clearing the sampler's workspace");
  for (CudaBuffer& h : h_sampled_) {
    LMSERVE_ASSIGN_OR_RETURN(h, CudaBuffer::Pinned(t * 4, "sampled tokens"));
  }
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&ahead_done_event_, cudaEventDisableTiming),
                               "cudaEventCreate");
  if (runner_config_.device_token_bitmask) {
    const int64_t mask_bytes = max_seqs_ * ((c.vocab_size + 31) / 32) * 4;
    LMSERVE_ASSIGN_OR_RETURN(token_bitmask_, CudaBuffer::Device(mask_bytes, "token bitmasks"));
    LMSERVE_ASSIGN_OR_RETURN(mask_gate_, CudaBuffer::Device(16, "the token bitmasks' gate"));
    LMSERVE_ASSIGN_OR_RETURN(h_token_bitmask_, CudaBuffer::Pinned(mask_bytes, "token bitmasks"));
    LMSERVE_ASSIGN_OR_RETURN(h_mask_sync_, CudaBuffer::Pinned(128, "the token bitmasks' release"));
    std::memset(h_mask_sync_.get(), 0, 128);
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&mask_stream_, cudaStreamNonBlocking),
                                 "cudaStreamCreate");
    // Pinned memory is mapped into the device's address space (unified addressing).
    void* device_address = nullptr;
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaHostGetDevicePointer(&device_address, h_mask_sync_.get(), 0),
                                 "mapping the token bitmasks' release");
    d_mask_release_ = static_cast<const uint64_t*>(device_address);
    d_mask_timed_out_ = static_cast<uint64_t*>(device_address) + 8;
    d_mask_waited_ns_ = static_cast<uint64_t*>(device_address) + 9;
    if (runner_config_.device_mask_read_pinned) {
      LMSERVE_RETURN_IF_CUDA_ERROR(
          cudaHostGetDevicePointer(&device_address, h_token_bitmask_.get(), 0),
          "mapping the token bitmasks");
      d_pinned_token_bitmask_ = static_cast<const uint32_t*>(device_address);
    }
  }
  if (runner_config_.time_device_steps) {
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaEventCreate(&step_start_event_), "cudaEventCreate");
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaEventCreate(&step_end_event_), "cudaEventCreate");
  }

  // Inputs: every table at most ceil(max position / block size) blocks long, one per group.
  const int64_t blocks_per_seq = (c.max_position_embeddings + block_size_ - 1) / block_size_;
  max_table_ids_ = max_seqs_ * blocks_per_seq * groups_.num_groups();
  LMSERVE_ASSIGN_OR_RETURN(
      inputs_, cuda::StepInputs::Create(t, max_seqs_, max_table_ids_, groups_.num_groups()));

  // Decode attention: the split cap of each batch size, and room for the largest partials
  // (bf16 only: in float32 every attention runs on PagedAttentionF32, which needs neither).
  int64_t decode_bytes = 16;
  for (int64_t b = 1; dtype_ == RunnerDType::kBFloat16 && HasAttentionLayers(c) && b <= max_seqs_;
       ++b) {
    const int splits = kc::DecodeAttentionParams::ChooseMaxSplits(
        b, c.num_attention_heads, c.num_kv_heads, c.head_dim, DType::kBF16, 1.0, kv_fp8_);
    decode_splits_[b] = splits;
    decode_bytes = std::max(decode_bytes, kc::DecodeAttentionParams::WorkspaceBytes(
                                              b, c.num_attention_heads, c.head_dim, splits));
  }
  LMSERVE_ASSIGN_OR_RETURN(decode_workspace_, CudaBuffer::Device(decode_bytes, "decode attention"));
  LMSERVE_ASSIGN_OR_RETURN(prefill_workspace_,
                           CudaBuffer::Device(kc::PrefillAttentionParams::WorkspaceBytes(max_seqs_),
                                              "prefill attention"));
  if (c.num_experts > 0) {
    LMSERVE_ASSIGN_OR_RETURN(
        moe_workspace_,
        CudaBuffer::Device(kc::MoeParams::WorkspaceBytes(t, c.num_experts, c.num_experts_per_tok,
                                                         c.hidden_size, c.moe_intermediate_size,
                                                         kernel_dtype_),
                           "the mixture of experts"));
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::AllocateKvPool() {
  // The state slots first (their count is fixed): the KV pool takes what the budget leaves.
  if (config_.ssm.num_heads > 0) {
    num_state_slots_ = static_cast<int32_t>(max_seqs_);
    layer_state_floats_ = CudaStateSlotBytes(config_) / 4 / NumSsmLayers(config_) *
                          num_state_slots_;
    LMSERVE_ASSIGN_OR_RETURN(
        state_pool_, CudaBuffer::Device(NumSsmLayers(config_) * layer_state_floats_ * 4,
                                        "the state slots"));
    LMSERVE_RETURN_IF_CUDA_ERROR(
        cudaMemsetAsync(state_pool_.get(), 0, state_pool_.bytes(), stream_),
        "zeroing the state slots");
    LMSERVE_ASSIGN_OR_RETURN(
        ssm_norm_partials_,
        CudaBuffer::Device(kc::kMaxSkinnyNormPartials * sizeof(float), "the SSM norm's sums"));
  }
  // What the memory budget leaves, or what the caller fixed.
  const int64_t kv_dim = config_.num_kv_heads * config_.head_dim;
  const int64_t block_bytes =
      2 * int64_t{groups_.layers_per_block} * block_size_ * kv_dim * KvElementBytes();
  if (block_bytes == 0) {
    // No KV cache layers (state-space layers only): blocks hold nothing; enough ids that the
    // engine's block accounting never limits the model.
    const int64_t per_sequence =
        (config_.max_position_embeddings + block_size_ - 1) / block_size_;
    num_blocks_ = static_cast<int32_t>(std::min<int64_t>(max_seqs_ * per_sequence + 1, int64_t{1} << 22));
    layer_cache_bytes_ = 0;
    LMSERVE_ASSIGN_OR_RETURN(kv_pool_, CudaBuffer::Device(16, "the KV cache"));
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    return absl::OkStatus();
  }
  int64_t kv_bytes = runner_config_.kv_cache_bytes;
  size_t free_bytes = 0, total_bytes = 0;
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const int64_t budget = static_cast<int64_t>(free_bytes) -
                         static_cast<int64_t>((1.0 - runner_config_.gpu_memory_utilization) *
                                              static_cast<double>(total_bytes)) -
                         kReserveBytes;
  if (kv_bytes == 0) kv_bytes = budget;
  if (kv_bytes < block_bytes) {
    return absl::ResourceExhaustedError(StrCat(
        "CUDA runner: no room for the KV cache: ", budget >> 20, " MiB left of ", total_bytes >> 20,
        " MiB at gpu_memory_utilization ", runner_config_.gpu_memory_utilization, " after ",
        weights_.bytes() >> 20, " MiB of weights; one block takes ", block_bytes, " bytes"));
  }
  num_blocks_ = static_cast<int32_t>(
      std::min<int64_t>(kv_bytes / block_bytes, std::numeric_limits<int32_t>::max()));
  layer_cache_bytes_ = int64_t{num_blocks_} * block_size_ * kv_dim * KvElementBytes();
  LMSERVE_ASSIGN_OR_RETURN(
      kv_pool_, CudaBuffer::Device(2 * int64_t{groups_.layers_per_block} * layer_cache_bytes_,
                                   "the KV cache"));
  // Zeros: a padded or stale slot never holds NaNs that a masked-out read could spread.
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(kv_pool_.get(), 0, kv_pool_.bytes(), stream_),
                               "zeroing the KV cache");
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  return absl::OkStatus();
}

std::pair<int, int64_t> CudaRunner::Projection(Weight weight, bool logits) {
  if (weight_projection_[weight.index] < 0) {
    const WeightPlan& plan = model_->weights();
    const WeightSpec& spec = plan[weight];
    cuda::GemmProjection projection;
    projection.kind = spec.kind;
    projection.n = spec.rows;
    projection.k = spec.cols;
    projection.output_dtype = logits ? DType::kF32 : kernel_dtype_;
    projection.logits = logits;
    projection.f8 = weights_.IsF8(weight);
    const std::vector<Weight> of_kind = plan.OfKind(spec.kind);
    for (Weight w : of_kind) {
      weight_layer_[w.index] = static_cast<int64_t>(projection.weights.size());
      projection.weights.push_back(weights_[w]);
      projection.scales.push_back(weights_.Scales(w));
      projection.blocks.push_back(weights_.Blocks(w));
    }
    const int id = gemms_->Add(std::move(projection));
    for (Weight w : of_kind) weight_projection_[w.index] = id;
  }
  return {weight_projection_[weight.index], weight_layer_[weight.index]};
}

absl::Status CudaRunner::AllReduce(Buffer buffer, int64_t width) {
  if (comm_ == nullptr || !collectives_) return absl::OkStatus();
  return comm_->AllReduceSum(Buf(buffer), step_.tokens * width, BufDType(buffer), stream_);
}

absl::Status CudaRunner::Embed(Weight table, float scale) {
  LMSERVE_RETURN_IF_ERROR(FlushLinear());
  const ModelConfig& c = config_;
  const Step& s = step_;
  const WeightSpec& spec = model_->weights()[table];
  // Under tensor parallelism each rank gathers its vocabulary rows (zeros for other ids), summed.
  const bool sliced = comm_ != nullptr && spec.split == Split::kVocab;
  kc::EmbeddingParams embed{.table = weights_[table],
                            .ids = In<int32_t>(s.layout->token_ids),
                            .output = Buf(Buffer::kResidual),
                            .num_tokens = s.tokens,
                            .vocab_size = spec.rows,
                            .hidden_size = c.hidden_size,
                            .dtype = kernel_dtype_,
                            .scale = scale,
                            .output_dtype = residual_dtype_};
  if (sliced) embed.first_id = int64_t{comm_->rank()} * spec.rows;
  LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(embed, stream_), "embedding");
  if (sliced) LMSERVE_RETURN_IF_ERROR(AllReduce(Buffer::kResidual, c.hidden_size));
  // A prefill step's attention plan, once for every layer (of the sequences after the leading
  // ones of one token, which decode attention takes).
  if (!s.decode_only && s.layout->one_token_prefix < s.seqs && dtype_ == RunnerDType::kBFloat16 &&
      HasAttentionLayers(c)) {
    LMSERVE_RETURN_IF_CUDA_ERROR(kc::LaunchPrefillPlan(PrefillPlanParams(), stream_),
                                 "prefill plan");
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::RmsNorm(Buffer in, Weight weight, float epsilon, Buffer out) {
  LMSERVE_RETURN_IF_ERROR(FlushLinear());
  LMSERVE_RETURN_IF_ERROR(CheckUnfolded({in}));
  Unfold(out);
  if (BufDType(out) != kernel_dtype_) {
    return absl::UnimplementedError(kResidualOnlyThere);
  }
  kc::RmsNormParams norm{.input = Buf(in),
                         .weight = weights_[weight],
                         .output = Buf(out),
                         .num_tokens = step_.tokens,
                         .hidden_size = model_->weights()[weight].rows,
                         .epsilon = epsilon,
                         .dtype = kernel_dtype_,
                         .input_dtype = BufDType(in)};
  LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(norm, stream_), "RMSNorm");
  return absl::OkStatus();
}

absl::Status CudaRunner::AddRmsNorm(Buffer residual, Buffer add, Weight weight, float epsilon,
                                    Buffer out) {
  LMSERVE_RETURN_IF_ERROR(FlushAddNorm());
  LMSERVE_RETURN_IF_ERROR(CheckUnfolded({residual, add}));
  Unfold(out);
  if (MayFoldAddNorm(residual, add, out)) {
    held_add_norm_ = HeldAddNorm{.residual = residual,
                                 .add = add,
                                 .out = out,
                                 .weight = weight,
                                 .epsilon = epsilon,
                                 .input_scales = {}};
    return absl::OkStatus();
  }
  if (MayQuantizeAddNorm(residual, add, out)) {
    LMSERVE_ASSIGN_OR_RETURN(const cuda::F8OutputScales scales, TakeScales(add));
    held_add_norm_ = HeldAddNorm{.residual = residual,
                                 .add = add,
                                 .out = out,
                                 .weight = weight,
                                 .epsilon = epsilon,
                                 .input_scales = scales};
    return absl::OkStatus();
  }
  return AddRmsNormNow(residual, add, weight, epsilon, out);
}

bool CudaRunner::MayFoldAddNorm(Buffer residual, Buffer add, Buffer out) const {
  return runner_config_.fold_add_norm && step_.tokens == 1 && comm_ == nullptr &&
         kernel_dtype_ == DType::kBF16 && BufDType(residual) == DType::kF32 &&
         BufDType(add) == kernel_dtype_ && BufDType(out) == kernel_dtype_ && add != out &&
         residual != out && residual != add && !deferred_linear_.has_value() &&
         !pending_scales_.has_value() && !residual_debt_.has_value() &&
         !pending_ssm_norm_.has_value();
}

bool CudaRunner::MayQuantizeAddNorm(Buffer residual, Buffer add, Buffer out) const {
  return FoldsF8Quantization() && BufDType(add) == kernel_dtype_ &&
         BufDType(out) == kernel_dtype_ && add != out && residual != out && residual != add &&
         !deferred_linear_.has_value() &&
         (!pending_scales_.has_value() || pending_scales_->buffer == add) &&
         !residual_debt_.has_value() && !pending_ssm_norm_.has_value();
}

absl::Status CudaRunner::FlushAddNorm() {
  if (held_activation_.has_value()) {
    Unfold(*held_activation_);
    held_activation_.reset();
    LMSERVE_RETURN_IF_ERROR(gemms_->RunHeldActivation());
  }
  if (!held_add_norm_.has_value()) return absl::OkStatus();
  const HeldAddNorm held = *held_add_norm_;
  held_add_norm_.reset();
  return AddRmsNormNow(held.residual, held.add, held.weight, held.epsilon, held.out,
                       &held.input_scales);
}

absl::Status CudaRunner::SettleResidual() {
  if (!residual_debt_.has_value()) return absl::OkStatus();
  const HeldAddNorm debt = *residual_debt_;
  residual_debt_.reset();
  const kc::FusedAddRmsNormParams add{.residual = Buf(debt.residual),
                                      .input = Buf(debt.add),
                                      .weight = weights_[debt.weight],
                                      .output = nullptr,  // the add alone
                                      .num_tokens = step_.tokens,
                                      .hidden_size = model_->weights()[debt.weight].rows,
                                      .epsilon = debt.epsilon,
                                      .dtype = kernel_dtype_,
                                      .residual_dtype = BufDType(debt.residual)};
  LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(add, stream_), "the residual's add");
  return absl::OkStatus();
}

absl::Status CudaRunner::CheckUnfolded(std::initializer_list<Buffer> reads) const {
  for (Buffer b : reads) {
    if (std::find(folded_outs_.begin(), folded_outs_.end(), b) != folded_outs_.end()) {
      return absl::InternalError(
          "CUDA runner: an op reads the output of an add + RMSNorm or a gated activation folded "
          "into a product (RunnerConfig::fold_add_norm); the fold assumes the product is its "
          "only reader");
    }
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::CarryFolds(std::initializer_list<Buffer> buffers) {
  LMSERVE_RETURN_IF_ERROR(CheckUnfolded(buffers));
  LMSERVE_RETURN_IF_ERROR(FlushAddNorm());
  if (!residual_debt_.has_value()) return absl::OkStatus();
  for (Buffer b : buffers) {
    if (b == residual_debt_->residual || b == residual_debt_->add) return SettleResidual();
  }
  return absl::OkStatus();
}

absl::StatusOr<cuda::GemmResidualFolds> CudaRunner::FoldsFor(Weight weight, Buffer* in,
                                                             Buffer out, bool gated) {
  LMSERVE_RETURN_IF_ERROR(CheckUnfolded({*in}));
  cuda::GemmResidualFolds folds;
  const auto [id, layer] = Projection(weight, /*logits=*/false);
  if (held_activation_.has_value() && *in == *held_activation_ && !gated &&
      gemms_->QuantizedInput(id, step_.tokens).has_value()) {
    held_activation_.reset();
    LMSERVE_RETURN_IF_ERROR(gemms_->RunHeldActivation(id));
    MarkFolded(*in);
    folds.input_quantized = true;
    // Neither a held norm nor a debt can be pending here (AddRmsNorm runs a held activation
    // first; debts are a one-token step's), but run them as any other op would.
    LMSERVE_RETURN_IF_ERROR(FlushAddNorm());
    LMSERVE_RETURN_IF_ERROR(SettleResidual());
    return folds;
  }
  if (held_activation_.has_value()) LMSERVE_RETURN_IF_ERROR(FlushAddNorm());
  if (!held_add_norm_.has_value() && !residual_debt_.has_value()) return folds;
  const cuda::GemmProjection& projection = gemms_->projection(id);
  const bool skinny = step_.tokens == 1 && gemms_->FoldsAtOneRow(id, layer);
  if (held_add_norm_.has_value()) {
    const HeldAddNorm held = *held_add_norm_;
    const bool reads_norm = *in == held.out && out != held.add && out != held.residual &&
                            projection.k == model_->weights()[held.weight].rows;
    if (skinny && reads_norm && held.input_scales.rows == nullptr) {
      held_add_norm_.reset();
      folds.add_norm_residual = static_cast<const float*>(Buf(held.residual));
      folds.add_norm_weight = weights_[held.weight];
      folds.add_norm_epsilon = held.epsilon;
      residual_debt_ = held;
      MarkFolded(held.out);
      *in = held.add;
      ++num_folded_add_norms_;
      return folds;
    }
    if (const std::optional<cuda::F8QuantizedInput> f8_in =
            step_.tokens > kc::kMaxSkinnyGemmRows ? gemms_->QuantizedInput(id, step_.tokens)
                                                  : std::nullopt;
        f8_in.has_value() && reads_norm) {
      held_add_norm_.reset();
      LMSERVE_RETURN_IF_ERROR(AddRmsNormNow(held.residual, held.add, held.weight, held.epsilon,
                                            held.out, &held.input_scales, &*f8_in));
      folds.input_quantized = true;
      MarkFolded(held.out);
      return folds;
    }
    LMSERVE_RETURN_IF_ERROR(FlushAddNorm());
  }
  if (residual_debt_.has_value()) {
    const HeldAddNorm debt = *residual_debt_;
    if (skinny && !gated && out == debt.add && *in != debt.add && *in != debt.residual &&
        projection.n == model_->weights()[debt.weight].rows) {
      residual_debt_.reset();
      folds.settle_residual = static_cast<float*>(Buf(debt.residual));
      return folds;
    }
    LMSERVE_RETURN_IF_ERROR(CarryFolds({*in, out}));
  }
  return folds;
}

absl::Status CudaRunner::AddRmsNormNow(Buffer residual, Buffer add, Weight weight, float epsilon,
                                       Buffer out, const cuda::F8OutputScales* taken,
                                       const cuda::F8QuantizedInput* f8_out) {
  if (deferred_linear_.has_value() && add == Buffer::kProjected &&
      residual == Buffer::kResidual) {
    // residual += in W^T in the GEMM's epilogue (fp32, unrounded), then the norm of the residual.
    const DeferredLinear deferred = *deferred_linear_;
    deferred_linear_.reset();
    const int id = ResidualProjection(deferred.weight);
    const int64_t layer = weight_layer_[deferred.weight.index];
    LMSERVE_RETURN_IF_ERROR(gemms_->RunAccumulate(id, layer, step_.tokens, Buf(deferred.in),
                                                  Buf(Buffer::kResidual), gate_up_.get()));
    return RmsNorm(Buffer::kResidual, weight, epsilon, out);
  }
  LMSERVE_RETURN_IF_ERROR(FlushLinear(/*keep_scales=*/true));
  cuda::F8OutputScales scales;
  if (taken != nullptr) {
    scales = *taken;
  } else {
    LMSERVE_ASSIGN_OR_RETURN(scales, TakeScales(add));
  }
  if (BufDType(add) != kernel_dtype_ || BufDType(out) != kernel_dtype_) {
    return absl::UnimplementedError(kResidualOnlyThere);
  }
  kc::FusedAddRmsNormParams norm{.residual = Buf(residual),
                                 .input = Buf(add),
                                 .weight = weights_[weight],
                                 .output = f8_out != nullptr ? nullptr : Buf(out),
                                 .num_tokens = step_.tokens,
                                 .hidden_size = model_->weights()[weight].rows,
                                 .epsilon = epsilon,
                                 .dtype = kernel_dtype_,
                                 .residual_dtype = BufDType(residual),
                                 .input_row_scales = scales.rows,
                                 .input_col_scales = scales.cols};
  if (f8_out != nullptr) {
    norm.f8_output = f8_out->rows;
    norm.f8_output_scales = f8_out->scales;
  }
  LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(norm, stream_), "add + RMSNorm");
  return absl::OkStatus();
}

absl::Status CudaRunner::Linear(Weight weight, Buffer in, Buffer out) {
  LMSERVE_ASSIGN_OR_RETURN(const cuda::GemmResidualFolds folds, FoldsFor(weight, &in, out));
  LMSERVE_RETURN_IF_ERROR(FlushLinear(/*keep_scales=*/false, /*keep_folds=*/true));
  Unfold(out);
  if (folds.OneRow() || folds.input_quantized) return LinearNow(weight, in, out, &folds);
  if (out == Buffer::kProjected && FusesIntoResidual(weight)) {
    deferred_linear_ = DeferredLinear{.weight = weight, .in = in};
    return absl::OkStatus();
  }
  return LinearNow(weight, in, out);
}

bool CudaRunner::FusesIntoResidual(Weight weight) const {
  // Steps of many tokens with prompt tokens among them (cuBLASLt; decode-only steps, graphs
  // included, stay as they were measured), whole models (a split projection's partial sums are
  // all-reduced before they are added), bf16 with the fp32 residual, 16-bit weights; the tuning
  // runs' outputs fit in gate_up_ (free between the MLP's activation and the next gate/up).
  const WeightSpec& spec = model_->weights()[weight];
  return runner_config_.fuse_residual_gemm && comm_ == nullptr && !step_.decode_only &&
         kernel_dtype_ == DType::kBF16 && residual_dtype_ == DType::kF32 &&
         step_.tokens > cuda::kMinTunedGemmRows && !weights_.IsF8(weight) &&
         !pending_ssm_norm_.has_value() && spec.rows == config_.hidden_size &&
         step_.tokens * spec.rows * int64_t{sizeof(float)} <= gate_up_.bytes();
}

absl::Status CudaRunner::FlushLinear(bool keep_scales, bool keep_folds) {
  if (!keep_folds) {
    LMSERVE_RETURN_IF_ERROR(FlushAddNorm());
    LMSERVE_RETURN_IF_ERROR(SettleResidual());
  }
  if (deferred_linear_.has_value()) {
    const DeferredLinear deferred = *deferred_linear_;
    deferred_linear_.reset();
    LMSERVE_RETURN_IF_ERROR(LinearNow(deferred.weight, deferred.in, Buffer::kProjected));
  }
  return keep_scales ? absl::OkStatus() : ApplyPendingScales();
}

absl::Status CudaRunner::ApplyPendingScales() {
  if (!pending_scales_.has_value()) return absl::OkStatus();
  const PendingScales pending = *pending_scales_;
  pending_scales_.reset();
  const kc::F8ScaleOutputParams scale{.y = Buf(pending.buffer),
                                      .row_scales = pending.scales.rows,
                                      .col_scales = pending.scales.cols,
                                      .m = pending.scales.m,
                                      .n = pending.scales.n,
                                      .y_stride = pending.scales.y_stride};
  LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(scale, stream_), "FP8 output scales");
  return absl::OkStatus();
}

absl::StatusOr<cuda::F8OutputScales> CudaRunner::TakeScales(Buffer buffer) {
  if (pending_scales_.has_value() && pending_scales_->buffer == buffer) {
    const cuda::F8OutputScales scales = pending_scales_->scales;
    pending_scales_.reset();
    return scales;
  }
  LMSERVE_RETURN_IF_ERROR(ApplyPendingScales());
  return cuda::F8OutputScales{};
}

int CudaRunner::ResidualProjection(Weight weight) {
  if (weight_residual_projection_[weight.index] < 0) {
    const auto [id, layer] = Projection(weight, /*logits=*/false);
    (void)layer;
    cuda::GemmProjection projection = gemms_->projection(id);
    projection.kind += " (into the residual)";
    projection.output_dtype = DType::kF32;
    const int fused = gemms_->Add(std::move(projection));
    for (Weight w : model_->weights().OfKind(model_->weights()[weight].kind)) {
      weight_residual_projection_[w.index] = fused;
    }
  }
  return weight_residual_projection_[weight.index];
}

absl::Status CudaRunner::LinearNow(Weight weight, Buffer in, Buffer out,
                                   const cuda::GemmResidualFolds* folds) {
  const auto [id, layer] = Projection(weight, /*logits=*/false);
  std::optional<PendingSsmNorm> norm;
  norm.swap(pending_ssm_norm_);
  if (norm.has_value() && (!norm->gated || norm->out != in)) {
    return absl::InternalError("CUDA runner: the SSM decode kernel's gated norm is not the next "
                               "product's input");
  }
  const WeightSpec& spec = model_->weights()[weight];
  // An FP8 product read next by QKV post-processing or the add + RMSNorm may leave its scales to
  // them (not partial sums to be all-reduced: each rank's would differ).
  cuda::F8OutputScales unscaled;
  const bool all_reduced = spec.split == Split::kCols && comm_ != nullptr;
  const bool leave_scales = (out == Buffer::kQkv || out == Buffer::kProjected) && !all_reduced &&
                            !norm.has_value();
  LMSERVE_RETURN_IF_ERROR(gemms_->Run(id, layer, step_.tokens, Buf(in), Buf(out), /*act=*/nullptr,
                                      /*late_dependents=*/false, kernels::GateActivation::kSilu,
                                      norm.has_value() ? &norm->epilogue : nullptr,
                                      leave_scales ? &unscaled : nullptr, folds));
  if (unscaled.rows != nullptr) pending_scales_ = PendingScales{.buffer = out, .scales = unscaled};
  if (spec.split == Split::kCols) return AllReduce(out, spec.rows);
  return absl::OkStatus();
}

absl::Status CudaRunner::GatedLinear(Weight gate_up, Activation act, Buffer in, Buffer out) {
  LMSERVE_ASSIGN_OR_RETURN(const cuda::GemmResidualFolds folds,
                           FoldsFor(gate_up, &in, out, /*gated=*/true));
  LMSERVE_RETURN_IF_ERROR(FlushLinear(/*keep_scales=*/false, /*keep_folds=*/true));
  kernels::GateActivation activation;
  switch (act) {
    case Activation::kSilu:
      activation = kernels::GateActivation::kSilu;
      break;
    case Activation::kGeluTanh:
      activation = kernels::GateActivation::kGeluTanh;
      break;
    default:
      return absl::UnimplementedError("CUDA runner: unsupported activation");
  }
  const auto [id, layer] = Projection(gate_up, /*logits=*/false);
  cuda::GemmResidualFolds run_folds = folds;
  run_folds.hold_activation = MayHoldActivation(id, in, out);
  Unfold(out);
  // The down projection follows, another stream of weights: it may launch only once gate/up has
  // read its own.
  LMSERVE_RETURN_IF_ERROR(gemms_->Run(
      id, layer, step_.tokens, Buf(in), gate_up_.get(), Buf(out), /*late_dependents=*/true,
      activation, /*norm=*/nullptr, /*unscaled=*/nullptr,
      run_folds.add_norm_residual != nullptr || run_folds.input_quantized ||
              run_folds.hold_activation
          ? &run_folds
          : nullptr));
  if (run_folds.hold_activation) held_activation_ = out;
  return absl::OkStatus();
}

bool CudaRunner::MayHoldActivation(int gate_up_id, Buffer in, Buffer out) const {
  return FoldsF8Quantization() && in != out && BufDType(out) == kernel_dtype_ &&
         gemms_->QuantizedInput(gate_up_id, step_.tokens).has_value();
}

bool CudaRunner::FoldsF8Quantization() const {
  return runner_config_.fold_add_norm && fp8_ && step_.tokens > kc::kMaxSkinnyGemmRows &&
         comm_ == nullptr && kernel_dtype_ == DType::kBF16;
}

absl::Status CudaRunner::Moe(const MoeLayer& moe, Buffer in, Buffer out) {
  LMSERVE_RETURN_IF_ERROR(FlushLinear());
  LMSERVE_RETURN_IF_ERROR(CheckUnfolded({in}));
  if (moe.act != Activation::kSilu) {
    return absl::UnimplementedError("CUDA runner: unsupported activation of the experts");
  }
  // Router, routing, and the fused path (small decode batches: only the chosen experts' rows
  // are read) or the grouped one, all from device memory: decode steps stay capturable.
  const kc::MoeParams params{.input = Buf(in),
                             .router = weights_[moe.router],
                             .gate_up = weights_[moe.gate_up],
                             .down = weights_[moe.down],
                             .output = Buf(out),
                             .workspace = moe_workspace_.get(),
                             .num_tokens = step_.tokens,
                             .hidden = config_.hidden_size,
                             .intermediate = moe.intermediate,
                             .num_experts = moe.num_experts,
                             .top_k = moe.top_k,
                             .normalize_top_k = moe.normalize_top_k,
                             .dtype = kernel_dtype_};
  LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(params, stream_), "mixture of experts");
  // Each rank's experts hold a slice of their intermediate features: partial sums.
  if (model_->weights()[moe.down].split == Split::kCols) {
    return AllReduce(out, config_.hidden_size);
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::RotaryAndCacheWrite(const AttentionLayer& layer, Buffer qkv) {
  LMSERVE_RETURN_IF_ERROR(CarryFolds({qkv}));
  LMSERVE_RETURN_IF_ERROR(FlushLinear(/*keep_scales=*/true, /*keep_folds=*/true));
  LMSERVE_ASSIGN_OR_RETURN(const cuda::F8OutputScales scales, TakeScales(qkv));
  const ModelConfig& c = config_;
  const StepLayout& l = *step_.layout;
  const int64_t qkv_dim = BufferWidth(Buffer::kQkv, c);
  const RopeConfig& rope = model_->rotary()[layer.rope];
  kc::QkvPostProcessParams post{
      .qkv = Buf(qkv),
      .bias = layer.qkv_bias.present() ? weights_[layer.qkv_bias] : nullptr,
      .positions = In<int32_t>(l.positions),
      .cos_sin = cos_sin_[layer.rope].as<float>(),
      .slot_mapping = In<int64_t>(l.slots) + Group(layer.layer) * step_.tokens,
      .query_out = Buf(qkv),
      .key_cache = KeyCache(layer.layer),
      .value_cache = ValueCache(layer.layer),
      .num_tokens = step_.tokens,
      .num_heads = c.num_attention_heads,
      .num_kv_heads = c.num_kv_heads,
      .head_dim = c.head_dim,
      .block_size = block_size_,
      .num_blocks = num_blocks_,
      .qkv_stride = qkv_dim,
      .query_out_stride = qkv_dim,
      .max_position = c.max_position_embeddings,
      .layout = rope.layout == RopeLayout::kInterleaved ? kernels::RotaryLayout::kInterleaved
                                                        : kernels::RotaryLayout::kHalfSplit,
      .dtype = kernel_dtype_,
      .qkv_row_scales = scales.rows,
      .qkv_col_scales = scales.cols};
  post.rotary_dim = RotaryDim(rope, c.head_dim);
  if (kv_fp8_) {
    post.cache_fp8 = true;
    post.k_scale = kv_scales_.k[static_cast<size_t>(layer.layer)];
    post.v_scale = kv_scales_.v[static_cast<size_t>(layer.layer)];
  }
  if (layer.q_norm.present()) {
    post.q_norm = weights_[layer.q_norm];
    post.k_norm = weights_[layer.k_norm];
    post.norm_epsilon = layer.norm_epsilon;
  }
  LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(post, stream_), "QKV post-processing");
  return absl::OkStatus();
}

template <typename Params>
Params CudaRunner::PagedAttentionParams(const AttentionLayer& layer, Buffer qkv, Buffer out) const {
  const ModelConfig& c = config_;
  const StepLayout& l = *step_.layout;
  Params params{
      .query = Buf(qkv),
      .key_cache = KeyCache(layer.layer),
      .value_cache = ValueCache(layer.layer),
      .context_lens = In<int32_t>(l.context_lens),
      // The layer's group's tables: each group's starts (step_.seqs + 1 of them) in
      // turn, all into one array of ids (StepLayout).
      .block_table_start = In<int32_t>(l.block_table_start) + Group(layer.layer) * (step_.seqs + 1),
      .block_table_ids = In<int32_t>(l.block_table_ids),
      .output = Buf(out),
      .num_seqs = step_.seqs,
      .num_heads = c.num_attention_heads,
      .num_kv_heads = c.num_kv_heads,
      .head_dim = c.head_dim,
      .block_size = block_size_,
      .num_blocks = num_blocks_,
      .query_stride = BufferWidth(qkv, c),
      .scale = layer.scale,
      .dtype = kernel_dtype_};
  params.window = layer.window;
  params.softcap = layer.softcap;
  return params;
}

template <typename Params>
Params CudaRunner::RaggedAttentionParams(const AttentionLayer& layer, Buffer qkv,
                                         Buffer out) const {
  auto params = PagedAttentionParams<Params>(layer, qkv, out);
  params.query_start = In<int32_t>(step_.layout->query_start);
  params.num_tokens = step_.tokens;
  return params;
}

kc::PrefillAttentionParams CudaRunner::PrefillParams(const AttentionLayer& layer, Buffer qkv,
                                                     Buffer out) const {
  auto params = RaggedAttentionParams<kc::PrefillAttentionParams>(layer, qkv, out);
  params.workspace = prefill_workspace_.get();
  const int64_t d = step_.layout->one_token_prefix;
  if (d > 0) {
    const int64_t query_stride =
        params.query_stride > 0 ? params.query_stride : params.num_heads * params.head_dim;
    params.query = static_cast<const unsigned char*>(params.query) + d * query_stride * element_bytes_;
    params.output = static_cast<unsigned char*>(params.output) +
                    d * params.num_heads * params.head_dim * element_bytes_;
    params.query_start = In<int32_t>(step_.layout->tail_query_start);
    params.context_lens += d;
    params.block_table_start += d;
    params.num_seqs -= d;
    params.num_tokens -= d;
  }
  return params;
}

kc::PrefillAttentionParams CudaRunner::PrefillPlanParams() const {
  AttentionLayer any_layer;
  any_layer.scale = 1.0f;
  return PrefillParams(any_layer, Buffer::kQkv, Buffer::kAttention);
}

absl::Status CudaRunner::Attention(const AttentionLayer& layer, Buffer qkv, Buffer out) {
  LMSERVE_RETURN_IF_ERROR(CarryFolds({qkv, out}));
  LMSERVE_RETURN_IF_ERROR(FlushLinear(/*keep_scales=*/false, /*keep_folds=*/true));
  LMSERVE_RETURN_IF_ERROR(CheckLayerWindow(layer, groups_));
  if (dtype_ == RunnerDType::kFloat32) {
    // One fp32 kernel for decode and prefill tokens alike (the others are bf16 tensor-core ones).
    const auto attn = RaggedAttentionParams<kc::PagedAttentionF32Params>(layer, qkv, out);
    LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(attn, stream_), "attention");
  } else {
    // The step's leading sequences of one new token (all of a decode-only step's; the engine
    // puts them first) on the decode kernel, the rest on the prefill kernel: a decode row on the
    // prefill kernel takes a tile of query rows a head for one row (an H100, FP8 Llama-3-8B: 512
    // decodes and 4 prompts of 128 tokens, 1.25 ms a layer against 0.1 ms on the decode kernel).
    const int64_t d = step_.layout->one_token_prefix;
    if (d > 0) {
      auto attn = PagedAttentionParams<kc::DecodeAttentionParams>(layer, qkv, out);
      attn.num_seqs = d;
      attn.workspace = decode_workspace_.get();
      attn.max_splits = decode_splits_.at(d);
      SetKvScales(layer, attn);
      LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(attn, stream_), "decode attention");
    }
    if (d < step_.seqs) {
      auto attn = PrefillParams(layer, qkv, out);
      attn.plan_ready = true;  // Embed planned the step
      SetKvScales(layer, attn);
      LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(attn, stream_), "prefill attention");
    }
  }
  return absl::OkStatus();
}

kc::SsmConvParams CudaRunner::SsmConvParams(const SsmLayer& layer, Buffer in, Buffer conv) const {
  const SsmConfig& ssm = config_.ssm;
  return {.seqs = SsmSequences(),
          // x B C follow the gate z in in_proj's output
          .input = static_cast<const unsigned char*>(Buf(in)) + ssm.inner() * element_bytes_,
          .input_stride = ssm.in_proj_dim(),
          .weight = weights_[layer.conv_weight],
          .bias = layer.conv_bias.present() ? weights_[layer.conv_bias] : nullptr,
          .output = Buf(conv),
          .conv_states = ConvStates(layer.state_layer),
          .channels = ssm.conv_dim(),
          .kernel = ssm.conv_kernel,
          .dtype = kernel_dtype_,
          .num_tokens = step_.tokens,
          .scalar = runner_config_.ssm_prefill_legacy};
}

kc::SsmScanParams CudaRunner::SsmScanParams(const SsmLayer& layer, Buffer in, Buffer conv,
                                            Buffer out) const {
  const SsmConfig& ssm = config_.ssm;
  return {.seqs = SsmSequences(),
          .xbc = Buf(conv),
          .xbc_stride = ssm.conv_dim(),
          .dt = static_cast<const unsigned char*>(Buf(in)) +
                (ssm.inner() + ssm.conv_dim()) * element_bytes_,
          .dt_stride = ssm.in_proj_dim(),
          .dt_bias = weights_[layer.dt_bias],
          .a_log = weights_[layer.a_log],
          .d = weights_[layer.d],
          .output = Buf(out),
          .ssm_states = SsmStates(layer.state_layer),
          .num_heads = ssm.num_heads,
          .head_dim = ssm.head_dim,
          .state_size = ssm.state_size,
          .n_groups = ssm.n_groups,
          .dt_min = static_cast<float>(ssm.time_step_min),
          .dt_max = static_cast<float>(ssm.time_step_max),
          .dtype = kernel_dtype_,
          .recurrence = runner_config_.ssm_prefill_legacy,
          .ssd_warps = runner_config_.ssm_scan_warps};
}

absl::Status CudaRunner::SsmConv(const SsmLayer& layer, Buffer in, Buffer conv) {
  LMSERVE_RETURN_IF_ERROR(CarryFolds({in, conv}));
  LMSERVE_RETURN_IF_ERROR(FlushLinear(/*keep_scales=*/false, /*keep_folds=*/true));
  // A decode-only step runs the conv inside SsmScan's fused kernel.
  if (step_.decode_only) return absl::OkStatus();
  LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(SsmConvParams(layer, in, conv), stream_), "SSM conv1d");
  return absl::OkStatus();
}

absl::Status CudaRunner::SsmScan(const SsmLayer& layer, Buffer in, Buffer conv, Buffer out) {
  LMSERVE_RETURN_IF_ERROR(CarryFolds({in, conv, out}));
  LMSERVE_RETURN_IF_ERROR(FlushLinear(/*keep_scales=*/false, /*keep_folds=*/true));
  if (step_.decode_only) {
    const SsmConfig& ssm = config_.ssm;
    kc::SsmDecodeParams decode{.conv = SsmConvParams(layer, in, conv),
                               .scan = SsmScanParams(layer, in, conv, out)};
    // The gated RMSNorm that follows, folded into this kernel (its gating and weight) and
    // out_proj's skinny GEMM (its scale), where out_proj runs that kernel (one token, bf16),
    // the norm spans the whole inner width (one group, no tensor parallelism) and the partial
    // sums fit the GEMM's epilogue (not with FP8 projections: their kernels have no such
    // epilogue). The norm's kernel alone costs more than the two additions
    // (an H100, Mamba-2-2.7B at batch 1: 2.8 us a layer on the step's critical path).
    if (runner_config_.fuse_ssm_norm && !fp8_ && step_.tokens == 1 && comm_ == nullptr &&
        ssm.norm_groups == 1 && gemms_->SkinnyAtOneRow(config_.hidden_size, ssm.inner())) {
      decode.norm = {.gate = Buf(in),
                     .gate_stride = ssm.in_proj_dim(),
                     .weight = weights_[layer.norm],
                     .partials = ssm_norm_partials_.as<float>()};
      const int64_t partials = kc::SsmDecodeNormPartials(decode);
      if (partials > 0 && partials <= kc::kMaxSkinnyNormPartials) {
        pending_ssm_norm_ = PendingSsmNorm{.out = out,
                                           .epilogue = {.partials = decode.norm.partials,
                                                        .num_partials = partials,
                                                        .width = ssm.inner(),
                                                        .epsilon = layer.norm_epsilon}};
      } else {
        decode.norm = {};
      }
    }
    decode.late_dependents = runner_config_.ssm_decode_late_dependents;
    LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(decode, stream_), "SSM decode update");
    return absl::OkStatus();
  }
  LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(SsmScanParams(layer, in, conv, out), stream_),
                               "SSM scan");
  return absl::OkStatus();
}

absl::Status CudaRunner::GatedRmsNorm(const SsmLayer& layer, Buffer in, Buffer y, Buffer out) {
  LMSERVE_RETURN_IF_ERROR(CarryFolds({in, y, out}));
  LMSERVE_RETURN_IF_ERROR(FlushLinear(/*keep_scales=*/false, /*keep_folds=*/true));
  const SsmConfig& ssm = config_.ssm;
  if (pending_ssm_norm_.has_value()) {  // done by the decode kernel and the next product
    if (pending_ssm_norm_->gated || pending_ssm_norm_->out != y || y != out) {
      return absl::InternalError("CUDA runner: the SSM decode kernel's gated norm is not this "
                                 "one, in place");
    }
    pending_ssm_norm_->gated = true;
    return absl::OkStatus();
  }
  const kc::SsmGatedRmsNormParams norm{.input = Buf(y),
                                       .gate = Buf(in),
                                       .gate_stride = ssm.in_proj_dim(),
                                       .weight = weights_[layer.norm],
                                       .output = Buf(out),
                                       .num_tokens = step_.tokens,
                                       .width = ssm.inner(),
                                       .group_size = ssm.inner() / ssm.norm_groups,
                                       .epsilon = layer.norm_epsilon,
                                       .dtype = kernel_dtype_};
  LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(norm, stream_), "gated RMSNorm");
  return absl::OkStatus();
}

absl::Status CudaRunner::FinalNorm(Buffer residual, Buffer add, Weight weight, float epsilon) {
  if (step_.rows == 0) return FlushLinear();
  LMSERVE_RETURN_IF_ERROR(CheckUnfolded({residual, add}));
  // Every token (cheaper than a gather first), then the rows that need logits.
  LMSERVE_RETURN_IF_ERROR(AddRmsNormNow(residual, add, weight, epsilon, Buffer::kNormed));
  final_rows_source_ = Buf(Buffer::kNormed);
  if (!step_.rows_are_tokens) {
    kc::EmbeddingParams gather{.table = Buf(Buffer::kNormed),
                               .ids = In<int32_t>(step_.layout->logits_rows),
                               .output = final_rows_.get(),
                               .num_tokens = step_.rows,
                               .vocab_size = step_.tokens,
                               .hidden_size = config_.hidden_size,
                               .dtype = kernel_dtype_};
    LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(gather, stream_), "gathering the logits rows");
    final_rows_source_ = final_rows_.get();
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::LmHead(Weight lm_head, float softcap) {
  LMSERVE_RETURN_IF_ERROR(FlushLinear());
  lm_head_ = lm_head;
  logit_softcap_ = softcap;
  if (step_.rows == 0) return absl::OkStatus();
  // Only the first chunk is computed here; Execute runs any further chunks (rows beyond
  // logits_chunk_rows_ come only with kAll sequences, never in a graph).
  return LogitsChunk(0, std::min(step_.rows, logits_chunk_rows_));
}

absl::Status CudaRunner::Sample() {
  LMSERVE_RETURN_IF_ERROR(FlushLinear());
  if (step_.rows == 0) return absl::OkStatus();
  if (draw_in_finish_) return absl::OkStatus();
  return SampleRows(0, std::min(step_.rows, logits_chunk_rows_),
                    gate_masks_ ? Masking::kGated : Masking::kNone, /*copy=*/false);
}

void CudaRunner::ReleaseMasks(bool abandoned) {
  kc::ReleaseTokenBitmasks(mask_release(), mask_step_, abandoned);
  masks_pending_ = false;
}

absl::Status CudaRunner::LogitsChunk(int64_t first_row, int64_t num_rows) {
  const auto [id, layer] = Projection(lm_head_, /*logits=*/true);
  const void* rows = static_cast<const unsigned char*>(final_rows_source_) +
                     first_row * config_.hidden_size * element_bytes_;
  const WeightSpec& spec = model_->weights()[lm_head_];
  if (comm_ == nullptr || spec.split != Split::kVocab) {
    LMSERVE_RETURN_IF_ERROR(gemms_->Run(id, layer, num_rows, rows, logits_.get()));
  } else {
    // Each rank's vocabulary slice, gathered from every rank and laid side by side in logits_.
    const int64_t vocab = config_.vocab_size, slice = spec.rows;
    LMSERVE_RETURN_IF_ERROR(gemms_->Run(id, layer, num_rows, rows, rank_logits_.get()));
    if (collectives_) {
      LMSERVE_RETURN_IF_ERROR(comm_->AllGather(rank_logits_.get(), gathered_logits_.get(),
                                               num_rows * slice, DType::kF32, stream_));
    }
    for (int64_t r = 0; r < comm_->size(); ++r) {
      const int64_t first = r * slice, count = std::min(slice, vocab - first);
      if (count <= 0) break;
      LMSERVE_RETURN_IF_CUDA_ERROR(
          cudaMemcpy2DAsync(logits_.as<float>() + first, vocab * sizeof(float),
                            gathered_logits_.as<float>() + r * num_rows * slice,
                            slice * sizeof(float), count * sizeof(float), num_rows,
                            cudaMemcpyDeviceToDevice, stream_),
          "laying out the logits slices");
    }
  }
  if (logit_softcap_ > 0) {
    const kc::SoftcapParams cap{
        .data = logits_.as<float>(), .count = num_rows * config_.vocab_size, .cap = logit_softcap_};
    LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(cap, stream_), "soft-capping the logits");
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::SampleRows(int64_t first_row, int64_t num_rows, Masking masking,
                                    bool copy) {
  // logits_ holds rows [first_row, first_row + num_rows); the settings are indexed by row.
  const StepLayout& l = *step_.layout;
  const uint32_t* bitmask = d_pinned_token_bitmask_ != nullptr ? d_pinned_token_bitmask_
                                                                : token_bitmask_.as<uint32_t>();
  if (masking == Masking::kReady) {
    // Structured output, the masks on the device and released: masked rows lose the tokens their
    // bitmask clears; other rows (mask -1) pass.
    const kc::TokenBitmaskParams mask{.logits = logits_.as<float>(),
                                      .bitmask = bitmask,
                                      .mask_index = In<int32_t>(l.mask_index) + first_row,
                                      .num_rows = num_rows,
                                      .vocab_size = config_.vocab_size};
    LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(mask, stream_), "masking the logits");
  } else if (masking == Masking::kGated) {
    // Structured output: masked rows wait for the step's masks (Finish releases them), then lose
    // the tokens their bitmask clears; other rows (mask -1) pass at once.
    const kc::GatedTokenBitmaskParams mask{
        .logits = logits_.as<float>(),
        .bitmask = bitmask,
        .mask_index = In<int32_t>(l.mask_index) + first_row,
        .step = In<uint64_t>(l.mask_step),
        .release = d_mask_release_,
        .timed_out = d_mask_timed_out_,
        .gate = mask_gate_.as<uint64_t>(),
        .waited_ns = d_mask_waited_ns_,
        .poll_per_row = runner_config_.device_mask_poll_per_row,
        .num_rows = num_rows,
        .vocab_size = config_.vocab_size,
        .timeout_ns = static_cast<int64_t>(runner_config_.device_mask_wait_seconds * 1e9)};
    LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(mask, stream_), "masking the logits");
  }
  kc::SamplingParams params{.logits = logits_.as<float>(),
                            .output = sampled_.as<int32_t>() + first_row,
                            .temperature = In<float>(l.temperature) + first_row,
                            .top_k = In<int32_t>(l.top_k) + first_row,
                            .top_p = In<float>(l.top_p) + first_row,
                            .min_p = In<float>(l.min_p) + first_row,
                            .seeds = In<uint64_t>(l.seeds) + first_row,
                            .steps = In<uint64_t>(l.steps) + first_row,
                            .num_rows = num_rows,
                            .vocab_size = config_.vocab_size,
                            .workspace = sampler_workspace_.get()};
  LMSERVE_RETURN_IF_CUDA_ERROR(kc::Launch(params, stream_), "sampling");
  if (!copy) return absl::OkStatus();
  LMSERVE_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(HostSampled() + first_row, sampled_.as<int32_t>() + first_row, num_rows * 4,
                      cudaMemcpyDeviceToHost, stream_),
      "copying the sampled tokens");
  return absl::OkStatus();
}

absl::Status CudaRunner::Forward(const Step& step) {
  step_ = step;
  pending_ssm_norm_.reset();
  deferred_linear_.reset();
  pending_scales_.reset();
  held_add_norm_.reset();
  residual_debt_.reset();
  folded_outs_.clear();
  held_activation_.reset();
  gemms_->DropHeldActivation();
  LMSERVE_RETURN_IF_ERROR(model_->Forward(*this));
  LMSERVE_RETURN_IF_ERROR(FlushLinear());
  if (pending_ssm_norm_.has_value()) {
    return absl::InternalError("CUDA runner: an SSM decode kernel's gated norm was left to a "
                               "product that never came");
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::Execute(const StepBatch& batch, StepOutput* output) {
  LMSERVE_RETURN_IF_ERROR(Launch(batch, output));
  return Finish();
}

bool CudaRunner::CanLaunchAhead() const {
  // Its Finish must enqueue nothing: no masks to wait for, no draw or logits chunk left to it, no
  // logits to copy back (those would run after the next step on the stream), no step timing.
  if (launched_batch_ == nullptr || ahead_.has_value() || masks_pending_ || draw_in_finish_ ||
      step_start_event_ != nullptr) {
    return false;
  }
  const std::vector<cuda::LogitsRow>& rows = inputs_.rows();
  if (static_cast<int64_t>(rows.size()) > logits_chunk_rows_) return false;
  return std::none_of(rows.begin(), rows.end(),
                      [](const cuda::LogitsRow& row) { return row.output_row >= 0; });
}

absl::Status CudaRunner::Launch(const StepBatch& batch, StepOutput* output) {
  launched_rows_.clear();
  if (launched_batch_ != nullptr && CanLaunchAhead()) {
    // The launched step goes ahead unfinished: its Finish will only wait for its end and read its
    // draws, from the host buffer this step does not write.
    AheadStep ahead;
    ahead.output = launched_output_;
    ahead.h_sampled_index = h_sampled_index_;
    launched_rows_.assign(static_cast<size_t>(launched_batch_->num_seqs()), -1);
    const std::vector<cuda::LogitsRow>& rows = inputs_.rows();
    for (int64_t r = 0; r < static_cast<int64_t>(rows.size()); ++r) {
      if (!rows[r].sampled) continue;
      ahead.sampled.emplace_back(static_cast<int32_t>(r), rows[r].seq);
      launched_rows_[static_cast<size_t>(rows[r].seq)] = static_cast<int32_t>(r);
    }
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaEventRecord(ahead_done_event_, stream_),
                                 "marking the end of the step launched ahead");
    ahead_ = std::move(ahead);
    h_sampled_index_ ^= 1;
  }
  launched_batch_ = nullptr;
  launched_output_ = nullptr;
  draw_in_finish_ = false;
  // The step before was launched and never finished (a broken contract): its draw stops waiting.
  if (masks_pending_) ReleaseMasks(/*abandoned=*/true);
  LMSERVE_RETURN_IF_ERROR(ValidateStepBatch(batch, config_, block_size_, num_blocks_,
                                            groups_.windows, num_state_slots_));
  for (const PendingToken& pending : batch.pending_tokens) {
    const auto seq = static_cast<size_t>(pending.launched_seq);
    if (seq >= launched_rows_.size() || launched_rows_[seq] < 0) {
      return absl::InvalidArgumentError(StrCat("step batch: pending token ", pending.token,
                                               " names sequence ", pending.launched_seq,
                                               ", which draws no token in a step launched ahead (",
                                               launched_rows_.size(), " sequences)"));
    }
  }
  // The caller's thread may hold another device (a tensor-parallel rank runs on the engine's).
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaSetDevice(runner_config_.device), "cudaSetDevice");
  const int64_t seqs = batch.num_seqs();
  const int64_t tokens = batch.num_tokens();
  if (tokens > max_tokens_ || seqs > max_seqs_ ||
      static_cast<int64_t>(batch.block_table_ids.size()) > max_table_ids_) {
    return absl::InvalidArgumentError(
        StrCat("step batch: ", seqs, " sequences, ", tokens, " tokens and ",
               batch.block_table_ids.size(), " table entries exceed the CUDA runner's limits (",
               max_seqs_, ", ", max_tokens_, ", ", max_table_ids_, ")"));
  }
  const bool masked = !batch.token_bitmask.empty();
  if (masked && !runner_config_.device_token_bitmask) {
    return absl::InvalidArgumentError("step batch: token bitmasks without device_token_bitmask");
  }
  const int64_t mask_words = (config_.vocab_size + 31) / 32;
  if (masked && static_cast<int64_t>(batch.token_bitmask.size()) != seqs * mask_words) {
    return absl::InvalidArgumentError(
        StrCat("step batch: ", batch.token_bitmask.size(), " token bitmask words for ", seqs,
               " sequences of ", mask_words, " words each"));
  }
  output->logits_row_start.assign(static_cast<size_t>(seqs + 1), 0);
  output->sampled_tokens.assign(static_cast<size_t>(seqs), -1);
  output->logits.clear();
  launched_batch_ = &batch;
  launched_output_ = output;
  if (seqs == 0) return absl::OkStatus();

  // Decode-only: one new token per sequence, each with a logits row. It takes the graph of the
  // smallest bucket that holds it.
  bool decode_only = tokens == seqs;
  for (int64_t i = 0; i < seqs; ++i) {
    if (batch.logits_modes[i] == LogitsMode::kNone) decode_only = false;
  }
  // A decode step replays its graph, masked or not: the graph's draw waits on the device for the
  // step's masks (released by Finish). An eager step with masked rows draws in Finish.
  if (masked) ++mask_step_;
  const int64_t bucket = decode_only ? graphs_.BucketFor(seqs) : 0;
  gate_masks_ = false;
  draw_in_finish_ = masked && bucket == 0;
  const int64_t padded = bucket > 0 ? bucket : seqs;
  layout_ = inputs_.Pack(batch, padded, decode_only, block_size_, mask_step_,
                         runner_config_.split_mixed_attention, launched_rows_);
  const std::vector<cuda::LogitsRow>& rows = inputs_.rows();
  const int64_t num_rows = static_cast<int64_t>(rows.size());
  const int64_t step_tokens = decode_only ? padded : tokens;
  absl::Status status;
  if (step_start_event_ != nullptr) {
    if (const cudaError_t e = cudaEventRecord(step_start_event_, stream_); e != cudaSuccess) {
      status = cuda::CudaError(e, "timing the step");
    }
  }
  if (status.ok()) status = inputs_.Upload(layout_, stream_);
  if (status.ok() && layout_.num_pending > 0) {
    // Tokens the step ahead draws: from its draws, still in sampled_ (this step's draw comes
    // after its forward pass).
    const kc::PendingTokensParams pending{
        .ids = const_cast<int32_t*>(inputs_.Device<int32_t>(layout_.token_ids)),
        .pairs = inputs_.Device<int32_t>(layout_.pending_pairs),
        .sampled = sampled_.as<int32_t>(),
        .count = layout_.num_pending};
    if (const cudaError_t e = kc::Launch(pending, stream_); e != cudaSuccess) {
      status = cuda::CudaError(e, "the tokens drawn by the step ahead");
    }
  }
  bool rows_are_tokens = num_rows == step_tokens;
  for (int64_t r = 0; rows_are_tokens && r < num_rows; ++r) rows_are_tokens = rows[r].token == r;
  const Step step{.layout = &layout_,
                  .tokens = step_tokens,
                  .seqs = decode_only ? padded : seqs,
                  .rows = num_rows,
                  .decode_only = decode_only,
                  .rows_are_tokens = rows_are_tokens};
  masks_pending_ = masked;
  if (status.ok() && bucket > 0) {
    // The graph read the final norm's rows from where the capture put them.
    step_ = step;
    final_rows_source_ = rows_are_tokens ? Buf(Buffer::kNormed) : final_rows_.get();
    status = graphs_.Replay(bucket, stream_);
    ++num_graph_replays_;
  } else if (status.ok()) {
    status = Forward(step);
    if (status.ok() && layout_.one_token_prefix > 0 && layout_.one_token_prefix < seqs &&
        dtype_ == RunnerDType::kBFloat16 && HasAttentionLayers(config_)) {
      ++num_split_attention_steps_;
    }
  }
  const bool draws =
      std::any_of(rows.begin(), rows.end(), [](const cuda::LogitsRow& row) { return row.sampled; });
  if (status.ok() && draws && !draw_in_finish_) {
    // The first chunk's draws (the Sample op's) to the host.
    const int64_t drawn = std::min(step.rows, logits_chunk_rows_);
    if (const cudaError_t e = cudaMemcpyAsync(HostSampled(), sampled_.get(), drawn * 4,
                                              cudaMemcpyDeviceToHost, stream_);
        e != cudaSuccess) {
      status = cuda::CudaError(e, "copying the sampled tokens");
    }
  }
  if (!status.ok()) {
    // A failed Launch gets no Finish: whatever was enqueued must not wait for masks.
    if (masks_pending_) ReleaseMasks(/*abandoned=*/true);
    launched_batch_ = nullptr;
    launched_output_ = nullptr;
  }
  return status;
}

absl::Status CudaRunner::Finish() {
  if (ahead_.has_value()) {
    const AheadStep ahead = *std::move(ahead_);
    ahead_.reset();
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaEventSynchronize(ahead_done_event_), "running the step");
    const int32_t* drawn = h_sampled_[ahead.h_sampled_index].as<int32_t>();
    for (const auto& [row, seq] : ahead.sampled) ahead.output->sampled_tokens[seq] = drawn[row];
    return absl::OkStatus();
  }
  if (launched_batch_ == nullptr) {
    return absl::FailedPreconditionError("CUDA runner: Finish without a Launch");
  }
  const StepBatch& batch = *launched_batch_;
  StepOutput* output = launched_output_;
  launched_batch_ = nullptr;
  launched_output_ = nullptr;
  const int64_t seqs = batch.num_seqs();
  const std::vector<cuda::LogitsRow>& rows = inputs_.rows();
  const int64_t num_rows = static_cast<int64_t>(rows.size());
  const bool masked = masks_pending_;
  if (masked) {
    // The masked rows' masks to the device (the step's draw is already enqueued, waiting for
    // them), by a copy on mask_stream_ that overlaps the forward pass, then their release. The
    // previous step's draw has finished reading them: its Finish waited for the stream. (The
    // draw's kernel could read the pinned rows itself, but 64 rows of 6 KB read over PCIe from
    // the kernel cost the step more than this copy does.)
    const auto upload_start = std::chrono::steady_clock::now();
    const size_t words = static_cast<size_t>((config_.vocab_size + 31) / 32);
    for (const cuda::LogitsRow& row : rows) {
      if (!row.sampled || !batch.sampling[row.seq].masked) continue;
      const size_t at = static_cast<size_t>(row.seq) * words;
      std::memcpy(h_token_bitmask_.as<uint32_t>() + at, batch.token_bitmask.data() + at,
                  words * sizeof(uint32_t));
    }
    cudaError_t copied = cudaSuccess;
    if (d_pinned_token_bitmask_ == nullptr) {  // else the kernel reads the pinned rows
      copied = cudaMemcpyAsync(token_bitmask_.get(), h_token_bitmask_.get(),
                               static_cast<size_t>(seqs) * words * sizeof(uint32_t),
                               cudaMemcpyHostToDevice, mask_stream_);
      if (copied == cudaSuccess) copied = cudaStreamSynchronize(mask_stream_);
    }
    ReleaseMasks(/*abandoned=*/copied != cudaSuccess);
    ++num_masked_steps_;
    mask_upload_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - upload_start).count();
    LMSERVE_RETURN_IF_CUDA_ERROR(copied, "copying the token bitmasks");
  }
  if (draw_in_finish_) {
    // An eager masked step's first chunk: the masks are on the device.
    draw_in_finish_ = false;
    LMSERVE_RETURN_IF_ERROR(
        SampleRows(0, std::min(step_.rows, logits_chunk_rows_), Masking::kReady));
  }
  if (seqs == 0) return absl::OkStatus();

  // Outputs: logits rows of kLast/kAll sequences, tokens of kSample ones.
  int64_t num_output_rows = 0;
  for (const cuda::LogitsRow& row : rows) {
    if (row.output_row < 0) continue;
    ++output->logits_row_start[row.seq + 1];
    ++num_output_rows;
  }
  for (int64_t i = 0; i < seqs; ++i) {
    output->logits_row_start[i + 1] += output->logits_row_start[i];
  }
  const int64_t vocab = config_.vocab_size;
  output->logits.resize(static_cast<size_t>(num_output_rows * vocab));
  for (int64_t chunk_start = 0; chunk_start < num_rows; chunk_start += logits_chunk_rows_) {
    const int64_t chunk = std::min(logits_chunk_rows_, num_rows - chunk_start);
    // The first chunk's logits came with the forward pass (or the graph), and its draw too, or
    // above. A sampled row can sit past the first chunk (a long kAll sequence before it): its
    // masks are on the device.
    if (chunk_start > 0) LMSERVE_RETURN_IF_ERROR(LogitsChunk(chunk_start, chunk));
    const bool sample =
        chunk_start > 0 &&
        std::any_of(rows.begin() + chunk_start, rows.begin() + chunk_start + chunk,
                    [](const cuda::LogitsRow& row) { return row.sampled; });
    if (sample) {
      LMSERVE_RETURN_IF_ERROR(
          SampleRows(chunk_start, chunk, masked ? Masking::kReady : Masking::kNone));
    }
    // Copy each run of consecutive output rows at once.
    for (int64_t r = chunk_start; r < chunk_start + chunk;) {
      if (rows[r].output_row < 0) {
        ++r;
        continue;
      }
      int64_t end = r + 1;
      while (end < chunk_start + chunk && rows[end].output_row == rows[end - 1].output_row + 1) {
        ++end;
      }
      LMSERVE_RETURN_IF_CUDA_ERROR(
          cudaMemcpyAsync(output->logits.data() + rows[r].output_row * vocab,
                          logits_.as<float>() + (r - chunk_start) * vocab,
                          static_cast<size_t>((end - r) * vocab) * sizeof(float),
                          cudaMemcpyDeviceToHost, stream_),
          "copying logits");
      r = end;
    }
  }
  if (step_end_event_ != nullptr) {
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaEventRecord(step_end_event_, stream_), "timing the step");
  }
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "running the step");
  if (step_end_event_ != nullptr) {
    float ms = 0.0f;
    LMSERVE_RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&ms, step_start_event_, step_end_event_),
                                 "timing the step");
    ++num_timed_device_steps_;
    device_step_seconds_ += 1e-3 * ms;
  }
  if (masked && !runner_config_.device_mask_poll_per_row) {
    mask_wait_seconds_ += 1e-9 * static_cast<double>(kc::TokenBitmaskWaitedNs(mask_waited_ns()));
  }
  if (masked && kc::TokenBitmaskTimedOutStep(mask_timed_out()) == mask_step_) {
    return absl::DeadlineExceededError(StrCat(
        "CUDA runner: the step's draw waited ", runner_config_.device_mask_wait_seconds,
        " s on the GPU for its token bitmasks and gave up (ModelRunner::Finish came too late)"));
  }
  for (int64_t r = 0; r < num_rows; ++r) {
    if (rows[r].sampled) output->sampled_tokens[rows[r].seq] = HostSampled()[r];
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::CaptureGraphs() {
  // New GEMM plans are autotuned while the graphs' sizes are warmed up: they serve every decode
  // step. Largest bucket first.
  const std::vector<int32_t> sizes = CudaGraphBatchSizes(static_cast<int32_t>(max_seqs_));
  StepBatch empty;
  auto for_each_size = [&](const std::function<absl::Status(int64_t, const Step&)>& run) {
    for (auto it = sizes.rbegin(); it != sizes.rend(); ++it) {
      const int64_t b = *it;
      const StepLayout layout = inputs_.Pack(empty, b, /*decode_only=*/true, block_size_);
      LMSERVE_RETURN_IF_ERROR(inputs_.Upload(layout, stream_));
      const Step step{.layout = &layout,
                      .tokens = b,
                      .seqs = b,
                      .rows = b,
                      .decode_only = true,
                      .rows_are_tokens = true};
      LMSERVE_RETURN_IF_ERROR(run(b, step));
    }
    return absl::OkStatus();
  };
  // The graphs' draw waits for masked rows' masks (none while capturing: every row is padding).
  gate_masks_ = runner_config_.device_token_bitmask;
  gemms_->set_autotune(true);
  if (comm_ != nullptr) {
    // Tensor parallelism: autotuning allocates, and an allocation may wait for every GPU of the
    // process to idle, which a collective waiting for this rank would never do. So the plans are
    // tuned first with the collectives off (the values are of no use), and the ranks capture only
    // once all are done allocating.
    collectives_ = false;
    absl::Status tuned = for_each_size([&](int64_t, const Step& step) { return Forward(step); });
    collectives_ = true;
    if (const cudaError_t e = cudaStreamSynchronize(stream_); tuned.ok() && e != cudaSuccess) {
      tuned = cuda::CudaError(e, "tuning the decode GEMMs");
    }
    gemms_->set_autotune(false);
    // Every rank arrives, failed or not: none may start collectives that another will not run.
    const bool all_tuned = comm_->HostBarrier(tuned.ok());
    LMSERVE_RETURN_IF_ERROR(tuned);
    if (!all_tuned) {
      return absl::AbortedError("another tensor-parallel rank failed to start (its error says why)");
    }
  }
  LMSERVE_RETURN_IF_ERROR(for_each_size([&](int64_t b, const Step& step) {
    return graphs_.Capture(b, stream_, [&] { return Forward(step); });
  }));
  gemms_->set_autotune(false);
  LMSERVE_RETURN_IF_ERROR(graphs_.Upload(stream_));
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "capturing decode graphs");
  return absl::OkStatus();
}

RunnerStats CudaRunner::stats() const {
  RunnerStats s;
  s.dtype = dtype_;
  s.quantization = fp8_ ? RunnerQuantization::kFp8 : block_quantization_;
  s.kv_cache_dtype = kv_fp8_ ? KvCacheDType::kFp8 : KvCacheDType::kAuto;
  s.weight_bytes = weights_.bytes();
  s.kv_cache_bytes = kv_pool_.bytes() + (num_state_slots_ > 0 ? state_pool_.bytes() : 0);
  s.workspace_bytes =
      gate_up_.bytes() + final_rows_.bytes() + logits_.bytes() + inputs_.device_bytes() +
      decode_workspace_.bytes() + prefill_workspace_.bytes() + moe_workspace_.bytes() +
      gemm_workspace_.bytes() + sampled_.bytes() + rank_logits_.bytes() + gathered_logits_.bytes() +
      dequant_scratch_.bytes() + sampler_workspace_.bytes();
  for (const CudaBuffer& buffer : buffers_) s.workspace_bytes += buffer.bytes();
  for (const CudaBuffer& table : cos_sin_) s.workspace_bytes += table.bytes();
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    s.device_memory_used_bytes = static_cast<int64_t>(total_bytes - free_bytes);
    s.device_memory_total_bytes = static_cast<int64_t>(total_bytes);
  } else {
    cudaGetLastError();
  }
  s.startup_seconds = startup_seconds_;
  s.num_cuda_graphs = graphs_.size();
  s.num_graph_replays = num_graph_replays_;
  s.num_sm90_gated_gemms = gemms_ != nullptr ? gemms_->sm90_gated_runs() : 0;
  s.num_split_attention_steps = num_split_attention_steps_;
  s.num_folded_add_norms = num_folded_add_norms_;
  s.num_masked_steps = num_masked_steps_;
  s.total_mask_upload_seconds = mask_upload_seconds_;
  s.total_mask_wait_seconds = mask_wait_seconds_;
  s.num_timed_device_steps = num_timed_device_steps_;
  s.total_device_step_seconds = device_step_seconds_;
  s.device_name = device_name_;
  s.cuda_kernels = cuda_kernels_;
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRunner(
    std::unique_ptr<const ModelDescription> model, const Checkpoint& checkpoint,
    const RunnerConfig& config) {
  return CudaRunner::Create(std::move(model), checkpoint, config);
}

absl::Status CheckCudaRunnerDevice(int32_t device) {
  const int num_devices = CudaDeviceCount();
  if (device < 0 || device >= num_devices) {
    return absl::FailedPreconditionError(
        StrCat("no CUDA GPU ", device, " on this machine (", num_devices, " found)"));
  }
  cudaDeviceProp prop{};
  if (const cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        StrCat("CUDA GPU ", device, ": cannot read its properties: ", cudaGetErrorString(e)));
  }
  const std::string gpu = StrCat("CUDA GPU ", device, " (", prop.name, ", compute capability ",
                                 prop.major, ".", prop.minor, ")");
  if (10 * prop.major + prop.minor < kc::kMinComputeCapability) {
    return absl::FailedPreconditionError(StrCat(
        gpu,
        " is not supported: the CUDA runner needs compute capability 8.0 or later (Ampere, "
        "Ada, Hopper and newer: bf16 tensor cores, cp.async); fp16-only GPUs are not supported, "
        "use --backend cpu"));
  }
  if (kc::KernelCodeCapability(device) == 0) {
    return absl::FailedPreconditionError(StrCat(
        gpu, ": this build holds no kernel code it can run (built for CUDA architectures ",
        LMSERVE_CUDA_ARCHITECTURES, "); rebuild with ", prop.major, prop.minor,
        " in -DCMAKE_CUDA_ARCHITECTURES, or a PTX architecture (e.g. 80-virtual) for the driver "
        "to compile"));
  }
  return absl::OkStatus();
}

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the "no driver" error
    return 0;
  }
  return count;
}

}  // namespace lmserve::engine
