#include "engine/runner/cpu_runner.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/strings.h"
#include "engine/core/check.h"
#include "engine/model/kv_cache_groups.h"
#include "engine/model/ops.h"
#include "engine/runner/communicator.h"
#include "engine/runner/dummy_weights.h"
#include "engine/runner/memory_plan.h"
#include "engine/runner/weight_loader.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/moe.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/quant_linear.h"
#include "kernels/cpu/rotary.h"
#include "kernels/cpu/sampling.h"
#include "kernels/cpu/ssm.h"

namespace lmserve::engine {
namespace {

// lm_head sums its reduction over hidden in double, over fp32 chunks of this many features.
constexpr int64_t kLogitsSplitK = 32;

// The block ids of a model with no KV cache layers (state-space layers only), whose blocks hold
// nothing: enough for max_num_seqs sequences of the longest context, so that the engine's block
// accounting never limits such a model.
int64_t NoKvLayerBlocks(const ModelConfig& model, const RunnerConfig& config) {
  const int64_t context =
      config.max_context_len > 0 ? config.max_context_len : model.max_position_embeddings;
  const int64_t per_sequence = (context + config.block_size_tokens - 1) / config.block_size_tokens;
  return std::min<int64_t>(int64_t{std::max(config.max_num_seqs, 1)} * per_sequence + 1,
                           int64_t{1} << 22);
}

// A zero-filled float array from calloc: large pools come from fresh mappings, so pages are only
// touched (and counted in the resident set) once the cache writes them.
struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using PoolPtr = std::unique_ptr<float[], FreeDeleter>;

// Resizes `v` to at least `n` elements; never shrinks (workspaces only grow).
template <typename T>
void Grow(std::vector<T>* v, int64_t n) {
  if (static_cast<int64_t>(v->size()) < n) v->resize(static_cast<size_t>(n));
}

kernels::RotaryLayout ToKernelLayout(RopeLayout layout) {
  return layout == RopeLayout::kInterleaved ? kernels::RotaryLayout::kInterleaved
                                            : kernels::RotaryLayout::kHalfSplit;
}

// A run of rows of one tensor in one element type.
struct WeightSegment {
  int64_t first_row = 0;
  int64_t rows = 0;
  kernels::DType dtype = kernels::DType::kF32;
  std::vector<std::byte> bytes;
};

// Whether the CPU runner keeps a part of `spec` in `dtype`, its checkpoint's type (in native mode):
// the matrices the linear layers, the LM head and the embedding read, where QuantLinear takes the
// type.
bool KeepsType(bool native, const WeightSpec& spec, kernels::DType dtype) {
  // (The SSM conv weights, [channels, kernel], are read by the conv kernel in fp32.)
  return native && spec.is_matrix() && spec.offset == 0 && !spec.kind.starts_with("moe_") &&
         spec.kind != "ssm_conv1d" &&
         dtype != kernels::DType::kF32 && kernels::QuantLinearSupports(dtype, spec.cols);
}

// The CPU runner's weights. In float32 mode every declared tensor is converted to fp32 (one
// segment each). In native mode the matrices that the linear layers, the LM head and the
// embedding read keep their checkpoint's type where QuantLinear takes it (the GGUF block formats,
// F16, BF16), part by part: a fused tensor whose parts differ in type (a K-quant mix's Q6_K V
// beside Q4_K Q and K) is several segments. Vectors, the experts of MoE layers (kernels/cpu/moe.h
// reads fp32) and everything else are fp32.
class CpuWeights final : public WeightSink {
 public:
  CpuWeights(const WeightPlan& plan, bool native)
      : plan_(plan), native_(native), segments_(plan.size()) {}

  absl::Status Store(const WeightSpec& spec, int64_t first_row, const TensorView& tensor) override {
    const int64_t rows = tensor.NumElements() / std::max<int64_t>(spec.cols, 1);
    if (KeepsType(native_, spec, tensor.dtype)) {
      std::byte* out = Append(spec, first_row, rows, tensor.dtype);
      std::memcpy(out, tensor.data, static_cast<size_t>(kernels::RowBytes(tensor.dtype, spec.cols) * rows));
    } else {
      kernels::DequantizeToF32(tensor.dtype, tensor.data,
                               reinterpret_cast<float*>(Append(spec, first_row, rows, kernels::DType::kF32)),
                               tensor.NumElements());
    }
    return absl::OkStatus();
  }
  absl::Status StoreDummy(const WeightSpec& spec, int64_t first_row,
                          const WeightPart& part) override {
    FillDummyF32(part.name, spec.fan_in(),
                 reinterpret_cast<float*>(Append(spec, first_row, part.rows, kernels::DType::kF32)),
                 part.rows * std::max<int64_t>(spec.cols, 1));
    return absl::OkStatus();
  }

  const std::vector<WeightSegment>& segments(Weight weight) const {
    return segments_[plan_.Storage(weight).index];
  }
  // An fp32 tensor's values. REQUIRES: the tensor is stored in fp32 (checked).
  const float* operator[](Weight weight) const {
    const std::vector<WeightSegment>& s = segments(weight);
    LMSERVE_CORE_CHECK(s.size() == 1 && s[0].dtype == kernels::DType::kF32, plan_[weight].name,
                       " is not stored in fp32");
    return reinterpret_cast<const float*>(s[0].bytes.data());
  }
  // Row `row` of a matrix in fp32, whatever its type.
  void RowF32(Weight weight, int64_t row, float* out) const {
    const int64_t cols = plan_[plan_.Storage(weight)].cols;
    for (const WeightSegment& segment : segments(weight)) {
      if (row < segment.first_row || row >= segment.first_row + segment.rows) continue;
      const int64_t row_bytes = kernels::RowBytes(segment.dtype, cols);
      kernels::DequantizeToF32(segment.dtype,
                               segment.bytes.data() + (row - segment.first_row) * row_bytes, out,
                               cols);
      return;
    }
  }
  int64_t bytes() const {
    int64_t total = 0;
    for (const std::vector<WeightSegment>& tensor : segments_) {
      for (const WeightSegment& segment : tensor) total += static_cast<int64_t>(segment.bytes.size());
    }
    return total;
  }

 private:
  // Room for `rows` rows of `spec` from `first_row` in `dtype`: the end of the last segment when
  // it is of that type and ends there, else a new segment (sized for the rest of the tensor).
  std::byte* Append(const WeightSpec& spec, int64_t first_row, int64_t rows, kernels::DType dtype) {
    std::vector<WeightSegment>& tensor = segments_[&spec - plan_.specs().data()];
    const int64_t cols = std::max<int64_t>(spec.cols, 1);
    const int64_t row_bytes = kernels::RowBytes(dtype, cols);
    if (tensor.empty() || tensor.back().dtype != dtype ||
        tensor.back().first_row + tensor.back().rows != first_row) {
      tensor.push_back({.first_row = first_row, .rows = 0, .dtype = dtype, .bytes = {}});
      tensor.back().bytes.reserve(static_cast<size_t>((spec.rows - first_row) * row_bytes));
    }
    WeightSegment& segment = tensor.back();
    const size_t offset = segment.bytes.size();
    segment.bytes.resize(offset + static_cast<size_t>(rows * row_bytes));
    segment.rows += rows;
    return segment.bytes.data() + offset;
  }

  const WeightPlan& plan_;
  const bool native_;
  std::vector<std::vector<WeightSegment>> segments_;  // by Weight::index; empty for tied tensors
};

class CpuRunner final : public ModelRunner, private ForwardOps {
 public:
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(
      std::unique_ptr<const ModelDescription> model, const Checkpoint& checkpoint,
      const RunnerConfig& config);

  const ModelConfig& model_config() const override { return config_; }
  Backend backend() const override { return Backend::kCpu; }
  int32_t block_size_tokens() const override { return block_size_; }
  int32_t num_kv_blocks() const override { return num_blocks_; }
  std::vector<int32_t> kv_group_windows() const override { return groups_.windows; }
  int32_t num_state_slots() const override { return num_state_slots_; }
  // Its kSample path (the CUDA runner's twin) masks rows as the CUDA runner's does.
  bool samples_with_token_bitmask() const override { return true; }

  absl::Status Execute(const StepBatch& batch, StepOutput* output) override;
  // Launch computes the forward pass and the logits; Finish masks and samples the kSample rows.
  absl::Status Launch(const StepBatch& batch, StepOutput* output) override;
  absl::Status Finish() override;
  RunnerStats stats() const override;

 private:
  CpuRunner(std::unique_ptr<const ModelDescription> model, const RunnerConfig& runner_config);

  // Plans the step: positions, cache slots, the rows that need logits; sizes the workspaces.
  void PlanStep(const StepBatch& batch, StepOutput* output);

  // ForwardOps, over the step that Execute set up.
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
  // A no-op: the draw waits for the step's token bitmasks, which come after Launch (Finish).
  absl::Status Sample() override { return absl::OkStatus(); }
  // The kSample rows' draw (masked rows first lose the tokens their bitmask clears).
  void SampleRows();

  float* Buf(Buffer buffer) { return buffers_[static_cast<int>(buffer)].data(); }
  // y = x W^T for `num_tokens` rows of x (stride ldx) into y (stride ldy), segment by segment:
  // fp32 rows through kernels::Linear (with `split_k`), the others through QuantLinear.
  void MatMul(Weight weight, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t num_tokens,
              int64_t split_k = 0);
  // Under tensor parallelism, the sum over the ranks of `rows` rows of `buffer` (width `width`),
  // in place: the output of a row-parallel projection. A no-op for a whole model.
  absl::Status AllReduce(Buffer buffer, int64_t width);
  // A KV cache layer's keys and values: the slot of its group's blocks that it occupies.
  float* KeyCache(int64_t layer) {
    return kv_pool_.get() + (2 * int64_t{groups_.layer_slot[layer]}) * layer_cache_floats_;
  }
  float* ValueCache(int64_t layer) {
    return kv_pool_.get() + (2 * int64_t{groups_.layer_slot[layer]} + 1) * layer_cache_floats_;
  }
  int32_t Group(int64_t layer) const { return groups_.layer_group[static_cast<size_t>(layer)]; }
  // A state-space layer's states: conv [slots, kernel - 1, conv_dim], then SSM
  // [slots, heads, head_dim, state_size].
  float* ConvStates(int64_t state_layer) { return state_pool_.get() + state_layer * layer_state_floats_; }
  float* SsmStates(int64_t state_layer) {
    return ConvStates(state_layer) + int64_t{num_state_slots_} * config_.ssm.conv_state_floats();
  }
  kernels::SsmSequences Sequences() const {
    return {.query_start = batch_->query_start.data(),
            .context_lens = batch_->context_lens.data(),
            .state_slots = batch_->state_slots.data(),
            .num_seqs = batch_->num_seqs(),
            .num_slots = num_state_slots_};
  }

  const std::unique_ptr<const ModelDescription> model_;
  const ModelConfig& config_;  // a rank's share under tensor parallelism
  Communicator* const comm_;   // null for a whole model
  const int32_t block_size_;
  const int num_threads_;
  const bool native_;  // weights in their checkpoint's types (RunnerDType::kNative)
  const bool int8_activations_;   // RunnerConfig::cpu_int8_activations
  const int32_t gemm_min_tokens_;  // RunnerConfig::cpu_gemm_min_tokens
  const int64_t q_dim_;                        // heads * head_dim
  const int64_t kv_dim_;                       // kv_heads * head_dim
  const int64_t qkv_dim_;                      // q_dim + 2 kv_dim
  std::vector<std::vector<double>> inv_freq_;  // by rotary embedding: [head_dim / 2]
  double startup_seconds_ = 0;

  CpuWeights weights_;

  // The KV pool: for each layer slot of a block (kv_cache_groups.h), keys then values, each
  // [num_blocks, block_size, kv_heads, head_dim]. A layer uses its slot, through its group's
  // tables.
  const KvCacheGroups groups_;
  int32_t num_blocks_ = 0;
  int64_t layer_cache_floats_ = 0;
  PoolPtr kv_pool_;
  // Recurrent states of the state-space layers: for each, every slot's conv and SSM state.
  int32_t num_state_slots_ = 0;
  int64_t layer_state_floats_ = 0;
  PoolPtr state_pool_;

  // Workspaces, [tokens, ...] unless noted.
  std::array<std::vector<float>, kNumBuffers> buffers_;  // by Buffer, [tokens, BufferWidth]
  std::vector<float> gate_up_;                           // [tokens, 2 intermediate]
  std::vector<float> attention_scratch_;                 // PagedAttentionParams::WorkspaceFloats
  kernels::MoeWorkspace moe_scratch_;
  kernels::QuantLinearWorkspace quant_scratch_;
  std::vector<int32_t> positions_;  // [tokens]
  std::vector<int64_t> slots_;      // [groups, tokens]: KV cache slot of each new token, by group
  // With several groups, each group's block tables as the kernels take them ([groups, seqs + 1]
  // starts, each group's from 0; the ids group by group); one group reads the batch's own.
  std::vector<int32_t> group_table_start_;
  std::vector<int32_t> group_table_ids_;
  std::vector<int64_t> group_ids_offset_;  // [groups]: where each group's ids begin
  // The rows that need logits, by token index: the returned rows (kLast, kAll), then the kSample
  // sequences' last tokens. FinalNorm packs their normed rows into final_rows_ in this order.
  std::vector<int32_t> logits_rows_;
  std::vector<float> final_rows_;  // [rows, hidden]
  // Tensor parallelism: the rank's vocabulary slice of the logits rows, and every rank's.
  std::vector<float> rank_logits_, gathered_logits_;
  // kSample sequences: their rows' logits, settings and chosen tokens.
  std::vector<float> sample_logits_;
  std::vector<float> sample_temperature_, sample_top_p_, sample_min_p_;
  std::vector<int32_t> sample_top_k_, sample_tokens_, sample_seqs_;
  std::vector<uint64_t> sample_seeds_, sample_steps_;

  // The step being executed (set by Launch for the ops, until Finish).
  const StepBatch* batch_ = nullptr;
  StepOutput* output_ = nullptr;
  int64_t num_tokens_ = 0;
  int64_t max_context_len_ = 0;
  int64_t num_returned_rows_ = 0;
  int64_t num_rows_ = 0;
};

CpuRunner::CpuRunner(std::unique_ptr<const ModelDescription> model,
                     const RunnerConfig& runner_config)
    : model_(std::move(model)),
      config_(model_->config()),
      comm_(runner_config.communicator),
      block_size_(runner_config.block_size_tokens),
      num_threads_(runner_config.num_threads > 0 ? runner_config.num_threads
                                                 : kernels::PhysicalCoreCount()),
      native_(ResolveRunnerDType(runner_config.dtype, Backend::kCpu) == RunnerDType::kNative),
      int8_activations_(runner_config.cpu_int8_activations),
      gemm_min_tokens_(runner_config.cpu_gemm_min_tokens),
      q_dim_(config_.num_attention_heads * config_.head_dim),
      kv_dim_(config_.num_kv_heads * config_.head_dim),
      qkv_dim_(q_dim_ + 2 * kv_dim_),
      weights_(model_->weights(), native_),
      groups_(PlanKvCacheGroups(model_->kv_windows())) {
  for (const RopeConfig& rope : model_->rotary()) {
    inv_freq_.push_back(RopeInverseFrequencies(rope, config_.head_dim));
  }
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CpuRunner::Create(
    std::unique_ptr<const ModelDescription> model_description, const Checkpoint& checkpoint,
    const RunnerConfig& config) {
  const ModelConfig& model = model_description->config();
  if (config.block_size_tokens <= 0 || config.kv_cache_bytes <= 0 || config.num_threads < 0 ||
      config.cpu_gemm_min_tokens < 0) {
    return absl::InvalidArgumentError(
        StrCat("runner config: block_size_tokens (", config.block_size_tokens,
               ") and kv_cache_bytes (", config.kv_cache_bytes,
               ") must be positive and num_threads (", config.num_threads,
               ") and cpu_gemm_min_tokens (", config.cpu_gemm_min_tokens, ") non-negative"));
  }
  const RunnerDType dtype = ResolveRunnerDType(config.dtype, Backend::kCpu);
  if (dtype != RunnerDType::kFloat32 && dtype != RunnerDType::kNative) {
    return absl::InvalidArgumentError(
        StrCat("CPU runner: dtype ", RunnerDTypeName(config.dtype),
               " is not supported: the CPU runner keeps the checkpoint's types (auto, native) or "
               "converts every weight to float32 (float32); bfloat16 needs the CUDA backend"));
  }
  if (config.quantization == RunnerQuantization::kFp8) {
    return absl::InvalidArgumentError(
        "CPU runner: --quantization fp8 is not supported: FP8 weights need the CUDA backend on a "
        "GPU of compute capability 8.9 or newer (an FP8 checkpoint is dequantized on the CPU with "
        "--quantization auto or none)");
  }
  if (RunnerQuantizationBlockType(config.quantization).has_value()) {
    return absl::InvalidArgumentError(StrCat(
        "CPU runner: --quantization ", RunnerQuantizationName(config.quantization),
        " is not supported: it makes dummy weights of that GGUF type for the CUDA runner (the CPU "
        "runner keeps a GGUF checkpoint's blocks as they are)"));
  }
  if (config.kv_cache_dtype != KvCacheDType::kAuto) {
    return absl::InvalidArgumentError(
        StrCat("CPU runner: --kv-cache-dtype ", KvCacheDTypeName(config.kv_cache_dtype),
               " is not supported: the CPU runner's KV cache is float32 (--kv-cache-dtype auto); "
               "an FP8 KV cache needs the CUDA backend on a GPU of compute capability 8.9 or "
               "newer"));
  }
  if (model.head_dim > kernels::PagedAttentionParams::kMaxHeadDim) {
    return absl::UnimplementedError(StrCat("CPU runner: head_dim ", model.head_dim,
                                           " is not supported (at most ",
                                           kernels::PagedAttentionParams::kMaxHeadDim, ")"));
  }
  const KvCacheGroups groups = PlanKvCacheGroups(model_description->kv_windows());
  const int64_t block_bytes = 2 * int64_t{groups.layers_per_block} * config.block_size_tokens *
                              model.num_kv_heads * model.head_dim * int64_t{sizeof(float)};
  const int64_t num_blocks =
      block_bytes > 0 ? std::min<int64_t>(config.kv_cache_bytes / block_bytes,
                                          std::numeric_limits<int32_t>::max())
                      : NoKvLayerBlocks(model, config);
  if (num_blocks < 1) {
    return absl::InvalidArgumentError(StrCat("runner config: kv_cache_bytes ",
                                             config.kv_cache_bytes, " is less than one KV block (",
                                             block_bytes, " bytes for ", config.block_size_tokens,
                                             " tokens of ", groups.layers_per_block, " layers)"));
  }
  // The memory plan, before anything is allocated: the weights as they will be stored, the
  // activations of the largest step, one logits row per sequence, and the KV pool.
  MemoryPlan plan;
  plan.device = "RAM";
  plan.weight_bytes = 0;
  for (const WeightSpec& spec : model_description->weights().specs()) {
    for (const WeightPart& part : spec.parts) {
      kernels::DType stored = kernels::DType::kF32;
      if (config.load_format != LoadFormat::kDummy) {
        const absl::StatusOr<const TensorView*> tensor =
            checkpoint.Get(part.name, spec.CheckpointShape(part));
        if (tensor.ok() && spec.split != Split::kCols &&
            KeepsType(dtype == RunnerDType::kNative, spec, (*tensor)->dtype)) {
          stored = (*tensor)->dtype;
        }
      }
      plan.weight_bytes += part.rows * kernels::RowBytes(stored, std::max<int64_t>(spec.cols, 1));
    }
  }
  const int64_t max_tokens = std::max<int64_t>(config.max_num_batched_tokens, 1);
  int64_t activation_floats = 2 * model.intermediate_size;  // gate_up_
  for (int b = 0; b < kNumBuffers; ++b) {
    activation_floats += BufferWidth(static_cast<Buffer>(b), model);
  }
  plan.workspace_bytes = (max_tokens * activation_floats +
                          int64_t{std::max(config.max_num_seqs, 1)} * model.vocab_size) *
                         int64_t{sizeof(float)};
  plan.kv_cache_bytes = num_blocks * block_bytes;
  const int32_t num_state_slots = model.ssm.num_heads > 0 ? std::max(config.max_num_seqs, 1) : 0;
  plan.state_bytes = int64_t{num_state_slots} * StateSlotBytes(model);
  const HostMemory host = AvailableHostMemory();
  plan.available_bytes = host.available_bytes;
  plan.available_source = host.source;
  LMSERVE_RETURN_IF_ERROR(CheckMemoryPlan(
      plan, "a smaller --kv-cache-mb or --max-num-batched-tokens, or a smaller model, may fit"));

  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<CpuRunner> runner(new CpuRunner(std::move(model_description), config));
  LMSERVE_RETURN_IF_ERROR(
      LoadWeights(runner->model_->weights(), checkpoint, config.load_format, runner->weights_));

  runner->num_blocks_ = static_cast<int32_t>(num_blocks);
  runner->layer_cache_floats_ = num_blocks * config.block_size_tokens * runner->kv_dim_;
  const size_t pool_floats =
      static_cast<size_t>(2 * int64_t{groups.layers_per_block} * runner->layer_cache_floats_);
  runner->kv_pool_.reset(static_cast<float*>(std::calloc(std::max<size_t>(pool_floats, 1), sizeof(float))));
  if (runner->kv_pool_ == nullptr) {
    return absl::ResourceExhaustedError(StrCat("CPU runner: cannot allocate a KV cache of ",
                                               pool_floats * sizeof(float), " bytes"));
  }
  runner->num_state_slots_ = num_state_slots;
  if (num_state_slots > 0) {
    const SsmConfig& ssm = model.ssm;
    runner->layer_state_floats_ =
        int64_t{num_state_slots} * (ssm.conv_state_floats() + ssm.ssm_state_floats());
    const size_t state_floats =
        static_cast<size_t>(NumSsmLayers(model) * runner->layer_state_floats_);
    runner->state_pool_.reset(static_cast<float*>(std::calloc(state_floats, sizeof(float))));
    if (runner->state_pool_ == nullptr) {
      return absl::ResourceExhaustedError(StrCat("CPU runner: cannot allocate state slots of ",
                                                 state_floats * sizeof(float), " bytes"));
    }
  }
  // Native mode calls BLAS only for what stays fp32 (MoE experts, column slices): single-threaded,
  // so that its threads never compete with the step's (kernels/cpu/parallel.h).
  kernels::SetBlasThreads(runner->native_ ? 1 : runner->num_threads_);
  runner->startup_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

void CpuRunner::PlanStep(const StepBatch& batch, StepOutput* output) {
  const ModelConfig& c = config_;
  const int64_t num_seqs = batch.num_seqs();
  num_tokens_ = batch.num_tokens();
  max_context_len_ = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    max_context_len_ = std::max<int64_t>(max_context_len_, batch.context_lens[i]);
  }
  for (int b = 0; b < kNumBuffers; ++b) {
    Grow(&buffers_[b], num_tokens_ * BufferWidth(static_cast<Buffer>(b), c));
  }
  Grow(&gate_up_, num_tokens_ * 2 * c.intermediate_size);
  Grow(&positions_, num_tokens_);
  const int64_t num_groups = groups_.num_groups();
  Grow(&slots_, num_groups * num_tokens_);
  Grow(&logits_rows_, num_tokens_);
  Grow(&attention_scratch_,
       kernels::PagedAttentionParams::WorkspaceFloats(max_context_len_, c.num_attention_heads,
                                                      c.num_kv_heads, num_threads_));

  output->logits_row_start.resize(static_cast<size_t>(num_seqs + 1));
  output->logits_row_start[0] = 0;
  output->sampled_tokens.assign(static_cast<size_t>(num_seqs), -1);
  sample_seqs_.clear();
  int64_t num_rows = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int32_t begin = batch.query_start[i];
    const int32_t end = batch.query_start[i + 1];
    const int32_t first_position = batch.context_lens[i] - (end - begin);
    for (int32_t t = begin; t < end; ++t) positions_[t] = first_position + (t - begin);
    for (int64_t g = 0; g < num_groups; ++g) {
      const std::span<const int32_t> table =
          batch.BlockTable(static_cast<int32_t>(i), static_cast<int32_t>(g));
      for (int32_t t = begin; t < end; ++t) {
        const int32_t position = positions_[t];
        slots_[g * num_tokens_ + t] =
            int64_t{table[static_cast<size_t>(position / block_size_)]} * block_size_ +
            position % block_size_;
      }
    }
    switch (batch.logits_modes[i]) {
      case LogitsMode::kNone:
        break;
      case LogitsMode::kLast:
        logits_rows_[num_rows++] = end - 1;
        break;
      case LogitsMode::kAll:
        for (int32_t t = begin; t < end; ++t) logits_rows_[num_rows++] = t;
        break;
      case LogitsMode::kSample:
        sample_seqs_.push_back(static_cast<int32_t>(i));
        break;
    }
    output->logits_row_start[i + 1] = static_cast<int32_t>(num_rows);
  }
  if (num_groups > 1) {
    group_table_start_.clear();
    group_table_ids_.clear();
    group_ids_offset_.clear();
    for (int64_t g = 0; g < num_groups; ++g) {
      group_ids_offset_.push_back(static_cast<int64_t>(group_table_ids_.size()));
      group_table_start_.push_back(0);
      for (int64_t i = 0; i < num_seqs; ++i) {
        const std::span<const int32_t> table =
            batch.BlockTable(static_cast<int32_t>(i), static_cast<int32_t>(g));
        group_table_ids_.insert(group_table_ids_.end(), table.begin(), table.end());
        group_table_start_.push_back(
            static_cast<int32_t>(group_table_ids_.size() - group_ids_offset_.back()));
      }
    }
  }
  output->logits.resize(static_cast<size_t>(num_rows * c.vocab_size));
  // kSample rows go after the returned ones; their logits stay here.
  num_returned_rows_ = num_rows;
  for (int32_t i : sample_seqs_) logits_rows_[num_rows++] = batch.query_start[i + 1] - 1;
  num_rows_ = num_rows;
}

absl::Status CpuRunner::Execute(const StepBatch& batch, StepOutput* output) {
  LMSERVE_RETURN_IF_ERROR(Launch(batch, output));
  return Finish();
}

absl::Status CpuRunner::Launch(const StepBatch& batch, StepOutput* output) {
  LMSERVE_RETURN_IF_ERROR(ValidateStepBatch(batch, config_, block_size_, num_blocks_,
                                            groups_.windows, num_state_slots_));
  PlanStep(batch, output);
  batch_ = &batch;
  output_ = output;
  if (num_tokens_ == 0) return absl::OkStatus();
  const absl::Status status = model_->Forward(*this);
  if (!status.ok()) {
    batch_ = nullptr;
    output_ = nullptr;
  }
  return status;
}

absl::Status CpuRunner::Finish() {
  if (batch_ == nullptr) {
    return absl::FailedPreconditionError("CPU runner: Finish without a Launch");
  }
  if (num_tokens_ > 0) SampleRows();
  batch_ = nullptr;
  output_ = nullptr;
  return absl::OkStatus();
}

absl::Status CpuRunner::AllReduce(Buffer buffer, int64_t width) {
  if (comm_ == nullptr) return absl::OkStatus();
  return comm_->AllReduceSum(Buf(buffer), num_tokens_ * width, kernels::DType::kF32, nullptr);
}

absl::Status CpuRunner::Embed(Weight table, float scale) {
  const int64_t hidden = config_.hidden_size;
  const WeightSpec& spec = model_->weights()[table];
  if (comm_ != nullptr && spec.split == Split::kVocab) {
    // This rank's vocabulary rows, zeros for the other ranks' ids; the sum is every token's row.
    const int64_t first_id = int64_t{comm_->rank()} * spec.rows;
    float* residual = Buf(Buffer::kResidual);
    for (int64_t t = 0; t < num_tokens_; ++t) {
      const int64_t row = batch_->token_ids[t] - first_id;
      float* out = residual + t * hidden;
      if (row >= 0 && row < spec.rows) {
        weights_.RowF32(table, row, out);
      } else {
        std::fill_n(out, hidden, 0.0f);
      }
    }
    LMSERVE_RETURN_IF_ERROR(AllReduce(Buffer::kResidual, hidden));
  } else if (weights_.segments(table).front().dtype != kernels::DType::kF32) {
    for (int64_t t = 0; t < num_tokens_; ++t) {
      weights_.RowF32(table, batch_->token_ids[t], Buf(Buffer::kResidual) + t * hidden);
    }
  } else {
    kernels::EmbeddingGather({.table = weights_[table],
                              .ids = batch_->token_ids.data(),
                              .output = Buf(Buffer::kResidual),
                              .num_tokens = num_tokens_,
                              .vocab_size = config_.vocab_size,
                              .hidden_size = hidden});
  }
  if (scale != 1.0f) {
    float* residual = Buf(Buffer::kResidual);
    for (int64_t i = 0; i < num_tokens_ * config_.hidden_size; ++i) residual[i] *= scale;
  }
  return absl::OkStatus();
}

absl::Status CpuRunner::RmsNorm(Buffer in, Weight weight, float epsilon, Buffer out) {
  kernels::RmsNorm({.input = Buf(in),
                    .weight = weights_[weight],
                    .output = Buf(out),
                    .num_tokens = num_tokens_,
                    .hidden_size = model_->weights()[weight].rows,
                    .epsilon = epsilon,
                    .num_threads = num_threads_});
  return absl::OkStatus();
}

absl::Status CpuRunner::AddRmsNorm(Buffer residual, Buffer add, Weight weight, float epsilon,
                                   Buffer out) {
  kernels::FusedAddRmsNorm({.residual = Buf(residual),
                            .input = Buf(add),
                            .weight = weights_[weight],
                            .output = Buf(out),
                            .num_tokens = num_tokens_,
                            .hidden_size = model_->weights()[weight].rows,
                            .epsilon = epsilon,
                            .num_threads = num_threads_});
  return absl::OkStatus();
}

void CpuRunner::MatMul(Weight weight, const float* x, int64_t ldx, float* y, int64_t ldy,
                       int64_t num_tokens, int64_t split_k) {
  const int64_t cols = model_->weights()[model_->weights().Storage(weight)].cols;
  for (const WeightSegment& segment : weights_.segments(weight)) {
    if (segment.dtype == kernels::DType::kF32) {
      kernels::Linear({.input = x,
                       .weight = reinterpret_cast<const float*>(segment.bytes.data()),
                       .output = y + segment.first_row,
                       .num_tokens = num_tokens,
                       .in_features = cols,
                       .out_features = segment.rows,
                       .input_stride = ldx,
                       .output_stride = ldy,
                       .split_k = split_k,
                       .num_threads = num_threads_});
    } else {
      kernels::QuantLinear({.weight = segment.bytes.data(),
                            .dtype = segment.dtype,
                            .input = x,
                            .output = y + segment.first_row,
                            .num_tokens = num_tokens,
                            .in_features = cols,
                            .out_features = segment.rows,
                            .input_stride = ldx,
                            .output_stride = ldy,
                            .num_threads = num_threads_,
                            .workspace = &quant_scratch_,
                            .precise_input = !int8_activations_,
                            .gemm_min_tokens = gemm_min_tokens_});
    }
  }
}

absl::Status CpuRunner::Linear(Weight weight, Buffer in, Buffer out) {
  const WeightSpec& spec = model_->weights()[weight];
  // State-space mixers' projections in the split form: a recurrent state carries their rounding
  // from token to token, and the split form's sums do not depend on the step's token count (BLAS
  // blocks them by it), so a prompt gives the same logits in any chunks.
  const int64_t split_k = spec.kind.starts_with("ssm_") ? kLogitsSplitK : 0;
  MatMul(weight, Buf(in), spec.cols, Buf(out), spec.rows, num_tokens_, split_k);
  if (spec.split == Split::kCols) return AllReduce(out, spec.rows);
  return absl::OkStatus();
}

absl::Status CpuRunner::GatedLinear(Weight gate_up, Activation act, Buffer in, Buffer out) {
  const WeightSpec& spec = model_->weights()[gate_up];
  MatMul(gate_up, Buf(in), spec.cols, gate_up_.data(), spec.rows, num_tokens_);
  kernels::GateActivation activation;
  switch (act) {
    case Activation::kSilu:
      activation = kernels::GateActivation::kSilu;
      break;
    case Activation::kGeluTanh:
      activation = kernels::GateActivation::kGeluTanh;
      break;
    default:
      return absl::UnimplementedError("CPU runner: unsupported activation");
  }
  kernels::SiluAndMul({.gate_up = gate_up_.data(),
                       .output = Buf(out),
                       .num_tokens = num_tokens_,
                       .intermediate_size = spec.rows / 2,
                       .activation = activation,
                       .num_threads = num_threads_});
  return absl::OkStatus();
}

absl::Status CpuRunner::Moe(const MoeLayer& moe, Buffer in, Buffer out) {
  if (moe.act != Activation::kSilu) {
    return absl::UnimplementedError("CPU runner: unsupported activation of the experts");
  }
  kernels::Moe({.input = Buf(in),
                .router = weights_[moe.router],
                .gate_up = weights_[moe.gate_up],
                .down = weights_[moe.down],
                .output = Buf(out),
                .num_tokens = num_tokens_,
                .hidden = config_.hidden_size,
                .intermediate = moe.intermediate,
                .num_experts = moe.num_experts,
                .top_k = moe.top_k,
                .normalize_top_k = moe.normalize_top_k,
                .workspace = &moe_scratch_});
  // Each rank's experts hold a slice of their intermediate features: partial sums.
  if (model_->weights()[moe.down].split == Split::kCols) {
    return AllReduce(out, config_.hidden_size);
  }
  return absl::OkStatus();
}

absl::Status CpuRunner::RotaryAndCacheWrite(const AttentionLayer& layer, Buffer qkv_buffer) {
  const ModelConfig& c = config_;
  float* qkv = Buf(qkv_buffer);
  if (layer.qkv_bias.present()) {
    const float* bias = weights_[layer.qkv_bias];
    for (int64_t t = 0; t < num_tokens_; ++t) {
      float* row = qkv + t * qkv_dim_;
      for (int64_t i = 0; i < qkv_dim_; ++i) row[i] += bias[i];
    }
  }
  if (layer.q_norm.present()) {  // each head of each token normed over head_dim, in place
    kernels::HeadRmsNorm({.data = qkv,
                          .weight = weights_[layer.q_norm],
                          .num_tokens = num_tokens_,
                          .num_heads = c.num_attention_heads,
                          .head_dim = c.head_dim,
                          .stride = qkv_dim_,
                          .epsilon = layer.norm_epsilon});
    kernels::HeadRmsNorm({.data = qkv + q_dim_,
                          .weight = weights_[layer.k_norm],
                          .num_tokens = num_tokens_,
                          .num_heads = c.num_kv_heads,
                          .head_dim = c.head_dim,
                          .stride = qkv_dim_,
                          .epsilon = layer.norm_epsilon});
  }
  const RopeConfig& rope = model_->rotary()[layer.rope];
  kernels::RotaryParams rotary{.query = qkv,
                               .key = qkv + q_dim_,
                               .positions = positions_.data(),
                               .inv_freq = inv_freq_[layer.rope].data(),
                               .num_tokens = num_tokens_,
                               .num_heads = c.num_attention_heads,
                               .num_kv_heads = c.num_kv_heads,
                               .head_dim = c.head_dim,
                               .query_stride = qkv_dim_,
                               .key_stride = qkv_dim_,
                               .layout = ToKernelLayout(rope.layout)};
  rotary.rotary_dim = RotaryDim(rope, c.head_dim);
  rotary.attention_factor = rope.attention_factor;
  kernels::ApplyRotary(rotary);
  kernels::WriteKvCache({.key = qkv + q_dim_,
                         .value = qkv + q_dim_ + kv_dim_,
                         .slot_mapping = slots_.data() + Group(layer.layer) * num_tokens_,
                         .key_cache = KeyCache(layer.layer),
                         .value_cache = ValueCache(layer.layer),
                         .num_tokens = num_tokens_,
                         .num_kv_heads = c.num_kv_heads,
                         .head_dim = c.head_dim,
                         .block_size = block_size_,
                         .num_blocks = num_blocks_,
                         .key_stride = qkv_dim_,
                         .value_stride = qkv_dim_});
  return absl::OkStatus();
}

absl::Status CpuRunner::Attention(const AttentionLayer& layer, Buffer qkv, Buffer out) {
  const ModelConfig& c = config_;
  const StepBatch& batch = *batch_;
  const int32_t group = Group(layer.layer);
  LMSERVE_RETURN_IF_ERROR(CheckLayerWindow(layer, groups_));
  const int32_t* table_start = batch.block_table_start.data();
  const int32_t* table_ids = batch.block_table_ids.data();
  if (groups_.num_groups() > 1) {
    table_start = group_table_start_.data() + int64_t{group} * (batch.num_seqs() + 1);
    table_ids = group_table_ids_.data() + group_ids_offset_[static_cast<size_t>(group)];
  }
  kernels::PagedAttentionParams attention{.query = Buf(qkv),
                                          .key_cache = KeyCache(layer.layer),
                                          .value_cache = ValueCache(layer.layer),
                                          .query_start = batch.query_start.data(),
                                          .context_lens = batch.context_lens.data(),
                                          .block_table_start = table_start,
                                          .block_table_ids = table_ids,
                                          .output = Buf(out),
                                          .workspace = attention_scratch_.data(),
                                          .num_seqs = batch.num_seqs(),
                                          .num_tokens = num_tokens_,
                                          .num_heads = c.num_attention_heads,
                                          .num_kv_heads = c.num_kv_heads,
                                          .head_dim = c.head_dim,
                                          .block_size = block_size_,
                                          .num_blocks = num_blocks_,
                                          .query_stride = qkv_dim_,
                                          .max_context_len = max_context_len_,
                                          .scale = layer.scale,
                                          .num_threads = num_threads_};
  attention.window = layer.window;
  attention.softcap = layer.softcap;
  kernels::PagedAttention(attention);
  return absl::OkStatus();
}

absl::Status CpuRunner::SsmConv(const SsmLayer& layer, Buffer in, Buffer conv) {
  const SsmConfig& ssm = config_.ssm;
  kernels::CausalConv1d({.seqs = Sequences(),
                         // x B C follow the gate z in in_proj's output
                         .input = Buf(in) + ssm.inner(),
                         .input_stride = ssm.in_proj_dim(),
                         .weight = weights_[layer.conv_weight],
                         .bias = layer.conv_bias.present() ? weights_[layer.conv_bias] : nullptr,
                         .output = Buf(conv),
                         .conv_states = ConvStates(layer.state_layer),
                         .channels = ssm.conv_dim(),
                         .kernel = ssm.conv_kernel,
                         .num_threads = num_threads_});
  return absl::OkStatus();
}

absl::Status CpuRunner::SsmScan(const SsmLayer& layer, Buffer in, Buffer conv, Buffer out) {
  const SsmConfig& ssm = config_.ssm;
  kernels::SsmScan({.seqs = Sequences(),
                    .xbc = Buf(conv),
                    .xbc_stride = ssm.conv_dim(),
                    .dt = Buf(in) + ssm.inner() + ssm.conv_dim(),
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
                    .chunk_size = ssm.chunk_size,
                    .dt_min = static_cast<float>(ssm.time_step_min),
                    .dt_max = static_cast<float>(ssm.time_step_max),
                    .num_threads = num_threads_});
  return absl::OkStatus();
}

absl::Status CpuRunner::GatedRmsNorm(const SsmLayer& layer, Buffer in, Buffer y, Buffer out) {
  const SsmConfig& ssm = config_.ssm;
  kernels::GatedRmsNorm({.input = Buf(y),
                         .gate = Buf(in),
                         .gate_stride = ssm.in_proj_dim(),
                         .weight = weights_[layer.norm],
                         .output = Buf(out),
                         .num_tokens = num_tokens_,
                         .width = ssm.inner(),
                         .group_size = ssm.inner() / ssm.norm_groups,
                         .epsilon = layer.norm_epsilon});
  return absl::OkStatus();
}

absl::Status CpuRunner::FinalNorm(Buffer residual, Buffer add, Weight weight, float epsilon) {
  // Only the logits rows, packed in logits_rows_ order.
  const int64_t hidden = config_.hidden_size;
  Grow(&final_rows_, num_rows_ * hidden);
  for (int64_t r = 0; r < num_rows_; ++r) {
    const int64_t t = logits_rows_[r];
    kernels::FusedAddRmsNorm({.residual = Buf(residual) + t * hidden,
                              .input = Buf(add) + t * hidden,
                              .weight = weights_[weight],
                              .output = final_rows_.data() + r * hidden,
                              .num_tokens = 1,
                              .hidden_size = hidden,
                              .epsilon = epsilon});
  }
  return absl::OkStatus();
}

absl::Status CpuRunner::LmHead(Weight lm_head, float softcap) {
  // The reduction summed in double over fp32 chunks: logits of tied-embedding models reach the
  // hundreds, where fp32 sums over all of hidden lose 1e-4.
  const int64_t hidden = config_.hidden_size;
  const int64_t num_sampled = num_rows_ - num_returned_rows_;
  // Logits of `num_rows` packed final rows from `first_row` into `out`, soft-capped when asked.
  auto logits = [&](int64_t first_row, int64_t num_rows, float* out) {
    if (num_rows == 0) return;
    MatMul(lm_head, final_rows_.data() + first_row * hidden, hidden, out, config_.vocab_size,
           num_rows, kLogitsSplitK);
    if (softcap > 0) kernels::Softcap(out, num_rows * config_.vocab_size, softcap);
  };
  if (num_sampled > 0) Grow(&sample_logits_, num_sampled * config_.vocab_size);
  const WeightSpec& spec = model_->weights()[lm_head];
  if (comm_ == nullptr || spec.split != Split::kVocab) {
    logits(0, num_returned_rows_, output_->logits.data());
    logits(num_returned_rows_, num_sampled, sample_logits_.data());
    return absl::OkStatus();
  }
  // Tensor parallelism: each rank's vocabulary slice of every row, gathered and laid side by side.
  const int64_t vocab = config_.vocab_size, slice = spec.rows, n = comm_->size();
  Grow(&rank_logits_, num_rows_ * slice);
  Grow(&gathered_logits_, n * num_rows_ * slice);
  if (num_rows_ > 0) {
    MatMul(lm_head, final_rows_.data(), hidden, rank_logits_.data(), slice, num_rows_,
           kLogitsSplitK);
  }
  LMSERVE_RETURN_IF_ERROR(comm_->AllGather(rank_logits_.data(), gathered_logits_.data(),
                                           num_rows_ * slice, kernels::DType::kF32, nullptr));
  for (int64_t row = 0; row < num_rows_; ++row) {
    float* out = row < num_returned_rows_
                     ? output_->logits.data() + row * vocab
                     : sample_logits_.data() + (row - num_returned_rows_) * vocab;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t first = r * slice, count = std::min(slice, vocab - first);
      if (count <= 0) break;
      std::copy_n(gathered_logits_.data() + (r * num_rows_ + row) * slice, count, out + first);
    }
    if (softcap > 0) kernels::Softcap(out, vocab, softcap);
  }
  return absl::OkStatus();
}

void CpuRunner::SampleRows() {
  if (sample_seqs_.empty()) return;
  const int64_t num_sampled = static_cast<int64_t>(sample_seqs_.size());
  sample_temperature_.clear(), sample_top_p_.clear(), sample_min_p_.clear();
  sample_top_k_.clear(), sample_seeds_.clear(), sample_steps_.clear();
  for (int32_t i : sample_seqs_) {
    const RunnerSampling& s = batch_->sampling[i];
    sample_temperature_.push_back(s.temperature);
    sample_top_k_.push_back(s.top_k);
    sample_top_p_.push_back(s.top_p);
    sample_min_p_.push_back(s.min_p);
    sample_seeds_.push_back(s.seed);
    sample_steps_.push_back(s.step);
  }
  const int64_t vocab = config_.vocab_size;
  for (int64_t k = 0; k < num_sampled; ++k) {
    const int32_t i = sample_seqs_[k];
    if (!batch_->sampling[i].masked) continue;
    kernels::ApplyTokenBitmask(sample_logits_.data() + k * vocab,
                               batch_->token_bitmask.data() + i * ((vocab + 31) / 32), vocab);
  }
  sample_tokens_.resize(static_cast<size_t>(num_sampled));
  kernels::Sample({.logits = sample_logits_.data(),
                   .output = sample_tokens_.data(),
                   .temperature = sample_temperature_.data(),
                   .top_k = sample_top_k_.data(),
                   .top_p = sample_top_p_.data(),
                   .min_p = sample_min_p_.data(),
                   .seeds = sample_seeds_.data(),
                   .steps = sample_steps_.data(),
                   .num_rows = num_sampled,
                   .vocab_size = config_.vocab_size});
  for (int64_t k = 0; k < num_sampled; ++k) {
    output_->sampled_tokens[sample_seqs_[k]] = sample_tokens_[k];
  }
}

RunnerStats CpuRunner::stats() const {
  RunnerStats s;
  s.dtype = native_ ? RunnerDType::kNative : RunnerDType::kFloat32;
  s.weight_bytes = weights_.bytes();
  s.kv_cache_bytes = 2 * int64_t{groups_.layers_per_block} * layer_cache_floats_ * 4 +
                     NumSsmLayers(config_) * layer_state_floats_ * 4;
  s.startup_seconds = startup_seconds_;
  s.device_name = "cpu";
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCpuRunner(
    std::unique_ptr<const ModelDescription> model, const Checkpoint& checkpoint,
    const RunnerConfig& config) {
  return CpuRunner::Create(std::move(model), checkpoint, config);
}

int64_t CpuKvBlockBytes(const ModelConfig& config, int32_t block_size_tokens) {
  return 2 * KvLayersPerBlock(config) * int64_t{block_size_tokens} * config.num_kv_heads *
         config.head_dim * static_cast<int64_t>(sizeof(float));
}

}  // namespace lmserve::engine
