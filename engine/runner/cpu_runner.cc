#include "engine/runner/cpu_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/strings.h"
#include "engine/runner/dummy_weights.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/rotary.h"
#include "kernels/cpu/sampling.h"

namespace lmserve::engine {
namespace {

// fp32 weights of one decoder layer.
struct LayerWeights {
  std::vector<float> input_norm;  // [hidden]
  std::vector<float> qkv;         // [(heads + 2 kv_heads) * head_dim, hidden]: q, k, v rows
  std::vector<float> qkv_bias;    // [(heads + 2 kv_heads) * head_dim], empty without bias
  std::vector<float> o_proj;      // [hidden, heads * head_dim]
  std::vector<float> post_norm;   // [hidden]
  std::vector<float> gate_up;     // [2 * intermediate, hidden]: gate rows, then up rows
  std::vector<float> down;        // [hidden, intermediate]
};

// lm_head sums its reduction over hidden in double, over fp32 chunks of this many features.
constexpr int64_t kLogitsSplitK = 32;

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

class CpuRunner final : public ModelRunner {
 public:
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(const Checkpoint& checkpoint,
                                                             const RunnerConfig& config);

  const ModelConfig& model_config() const override { return config_; }
  Backend backend() const override { return Backend::kCpu; }
  int32_t block_size_tokens() const override { return block_size_; }
  int32_t num_kv_blocks() const override { return num_blocks_; }

  absl::Status Execute(const StepBatch& batch, StepOutput* output) override;
  RunnerStats stats() const override;

 private:
  CpuRunner(const ModelConfig& config, const RunnerConfig& runner_config);

  absl::Status LoadWeights(const Checkpoint& checkpoint);
  absl::Status LoadTensor(const Checkpoint& checkpoint, const std::string& name,
                          const std::vector<int64_t>& shape, float* dst) const;
  absl::Status LoadVector(const Checkpoint& checkpoint, const std::string& name,
                          const std::vector<int64_t>& shape, std::vector<float>* out) const;
  // Makes the workspaces hold `num_tokens` tokens with contexts up to `max_context_len`.
  void EnsureWorkspace(int64_t num_tokens, int64_t max_context_len);
  void RunLayer(int64_t layer, const StepBatch& batch, int64_t num_tokens, int64_t max_context_len);

  float* KeyCache(int64_t layer) { return kv_pool_.get() + (2 * layer) * layer_cache_floats_; }
  float* ValueCache(int64_t layer) {
    return kv_pool_.get() + (2 * layer + 1) * layer_cache_floats_;
  }

  const ModelConfig config_;
  const int32_t block_size_;
  const int num_threads_;
  const int64_t q_dim_;    // heads * head_dim
  const int64_t kv_dim_;   // kv_heads * head_dim
  const int64_t qkv_dim_;  // q_dim + 2 kv_dim
  const kernels::RotaryLayout rotary_layout_;
  const std::vector<double> inv_freq_;  // [head_dim / 2]
  const bool dummy_weights_;
  double startup_seconds_ = 0;

  // Weights.
  std::vector<float> embed_;            // [vocab, hidden]
  std::vector<float> final_norm_;       // [hidden]
  std::vector<float> lm_head_storage_;  // [vocab, hidden]; empty when tied
  const float* lm_head_ = nullptr;      // lm_head_storage_ or embed_
  std::vector<LayerWeights> layers_;

  // The KV pool: for each layer, keys then values, each [num_blocks, block_size, kv_heads,
  // head_dim].
  int32_t num_blocks_ = 0;
  int64_t layer_cache_floats_ = 0;
  PoolPtr kv_pool_;

  // Workspaces, [tokens, ...] unless noted.
  std::vector<float> residual_;           // [tokens, hidden]: the residual stream
  std::vector<float> normed_;             // [tokens, hidden]: normalized input of a projection
  std::vector<float> qkv_;                // [tokens, qkv_dim]
  std::vector<float> attention_;          // [tokens, q_dim]
  std::vector<float> projected_;          // [tokens, hidden]: o_proj and down_proj outputs
  std::vector<float> gate_up_;            // [tokens, 2 intermediate]
  std::vector<float> activation_;         // [tokens, intermediate]
  std::vector<float> attention_scratch_;  // PagedAttentionParams::WorkspaceFloats
  std::vector<int32_t> positions_;        // [tokens]
  std::vector<int64_t> slots_;            // [tokens]: KV cache slot of each new token
  std::vector<int32_t> logits_rows_;      // [rows]: the token index of each logits row
  // kSample sequences: their rows' logits (after the returned rows), settings, chosen tokens.
  std::vector<float> sample_logits_;
  std::vector<float> sample_temperature_, sample_top_p_, sample_min_p_;
  std::vector<int32_t> sample_top_k_, sample_tokens_, sample_seqs_;
  std::vector<uint64_t> sample_seeds_, sample_steps_;
};

CpuRunner::CpuRunner(const ModelConfig& config, const RunnerConfig& runner_config)
    : config_(config),
      block_size_(runner_config.block_size_tokens),
      num_threads_(runner_config.num_threads > 0
                       ? runner_config.num_threads
                       : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))),
      q_dim_(config.num_attention_heads * config.head_dim),
      kv_dim_(config.num_kv_heads * config.head_dim),
      qkv_dim_(q_dim_ + 2 * kv_dim_),
      rotary_layout_(config.rope.layout == RopeLayout::kInterleaved
                         ? kernels::RotaryLayout::kInterleaved
                         : kernels::RotaryLayout::kHalfSplit),
      inv_freq_(RopeInverseFrequencies(config)),
      dummy_weights_(runner_config.load_format == LoadFormat::kDummy) {}

// Converts tensor `name` (checked against `shape`) to fp32 into dst[0 .. elements); with dummy
// weights (LoadFormat::kDummy), fills it with their values instead.
absl::Status CpuRunner::LoadTensor(const Checkpoint& checkpoint, const std::string& name,
                                   const std::vector<int64_t>& shape, float* dst) const {
  if (dummy_weights_) {
    int64_t elements = 1;
    for (int64_t d : shape) elements *= d;
    FillDummyF32(name, shape.size() == 2 ? shape[1] : shape[0], dst, elements);
    return absl::OkStatus();
  }
  absl::StatusOr<const TensorView*> tensor = checkpoint.Get(name, shape);
  if (!tensor.ok()) return tensor.status();
  if (absl::Status s = CheckTensorBytes(**tensor); !s.ok()) return s;
  kernels::DequantizeToF32((*tensor)->dtype, (*tensor)->data, dst, (*tensor)->NumElements());
  return absl::OkStatus();
}

absl::Status CpuRunner::LoadVector(const Checkpoint& checkpoint, const std::string& name,
                                   const std::vector<int64_t>& shape,
                                   std::vector<float>* out) const {
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  out->resize(static_cast<size_t>(elements));
  return LoadTensor(checkpoint, name, shape, out->data());
}

absl::Status CpuRunner::LoadWeights(const Checkpoint& checkpoint) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size;
  const int64_t inter = c.intermediate_size;
  if (absl::Status s =
          LoadVector(checkpoint, "model.embed_tokens.weight", {c.vocab_size, hidden}, &embed_);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = LoadVector(checkpoint, "model.norm.weight", {hidden}, &final_norm_);
      !s.ok()) {
    return s;
  }
  if (c.tie_word_embeddings) {
    lm_head_ = embed_.data();
  } else {
    if (absl::Status s =
            LoadVector(checkpoint, "lm_head.weight", {c.vocab_size, hidden}, &lm_head_storage_);
        !s.ok()) {
      return s;
    }
    lm_head_ = lm_head_storage_.data();
  }
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerWeights& w = layers_[l];
    auto name = [l](const char* suffix) { return LayerTensorName(l, suffix); };
    const struct {
      std::string name;
      std::vector<int64_t> shape;
      std::vector<float>* out;
    } plain[] = {
        {name("input_layernorm.weight"), {hidden}, &w.input_norm},
        {name("self_attn.o_proj.weight"), {hidden, q_dim_}, &w.o_proj},
        {name("post_attention_layernorm.weight"), {hidden}, &w.post_norm},
        {name("mlp.down_proj.weight"), {hidden, inter}, &w.down},
    };
    for (const auto& t : plain) {
      if (absl::Status s = LoadVector(checkpoint, t.name, t.shape, t.out); !s.ok()) return s;
    }
    // Fused rows: q, k, v one after another (and their biases), gate then up.
    w.qkv.resize(static_cast<size_t>(qkv_dim_ * hidden));
    const struct {
      const char* suffix;
      int64_t rows;
      int64_t first_row;
    } qkv_parts[] = {{"self_attn.q_proj", q_dim_, 0},
                     {"self_attn.k_proj", kv_dim_, q_dim_},
                     {"self_attn.v_proj", kv_dim_, q_dim_ + kv_dim_}};
    if (c.attention_bias) w.qkv_bias.resize(static_cast<size_t>(qkv_dim_));
    for (const auto& part : qkv_parts) {
      if (absl::Status s = LoadTensor(checkpoint, StrCat(name(part.suffix), ".weight"),
                                      {part.rows, hidden}, w.qkv.data() + part.first_row * hidden);
          !s.ok()) {
        return s;
      }
      if (!c.attention_bias) continue;
      if (absl::Status s = LoadTensor(checkpoint, StrCat(name(part.suffix), ".bias"), {part.rows},
                                      w.qkv_bias.data() + part.first_row);
          !s.ok()) {
        return s;
      }
    }
    w.gate_up.resize(static_cast<size_t>(2 * inter * hidden));
    if (absl::Status s =
            LoadTensor(checkpoint, name("mlp.gate_proj.weight"), {inter, hidden}, w.gate_up.data());
        !s.ok()) {
      return s;
    }
    if (absl::Status s = LoadTensor(checkpoint, name("mlp.up_proj.weight"), {inter, hidden},
                                    w.gate_up.data() + inter * hidden);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CpuRunner::Create(const Checkpoint& checkpoint,
                                                               const RunnerConfig& config) {
  const ModelConfig& model = checkpoint.config();
  if (absl::Status s = ValidateModelConfig(model); !s.ok()) return s;
  if (config.block_size_tokens <= 0 || config.kv_cache_bytes <= 0 || config.num_threads < 0) {
    return absl::InvalidArgumentError(
        StrCat("runner config: block_size_tokens (", config.block_size_tokens,
               ") and kv_cache_bytes (", config.kv_cache_bytes,
               ") must be positive and num_threads (", config.num_threads, ") non-negative"));
  }
  if (ResolveRunnerDType(config.dtype, Backend::kCpu) != RunnerDType::kFloat32) {
    return absl::InvalidArgumentError(
        StrCat("CPU runner: dtype ", RunnerDTypeName(config.dtype),
               " is not supported: the CPU runner computes in float32 only (use auto or float32; "
               "bfloat16 needs the CUDA backend)"));
  }
  if (model.head_dim > kernels::PagedAttentionParams::kMaxHeadDim) {
    return absl::UnimplementedError(StrCat("CPU runner: head_dim ", model.head_dim,
                                           " is not supported (at most ",
                                           kernels::PagedAttentionParams::kMaxHeadDim, ")"));
  }
  const int64_t block_bytes = CpuKvBlockBytes(model, config.block_size_tokens);
  const int64_t num_blocks =
      std::min<int64_t>(config.kv_cache_bytes / block_bytes, std::numeric_limits<int32_t>::max());
  if (num_blocks < 1) {
    return absl::InvalidArgumentError(StrCat(
        "runner config: kv_cache_bytes ", config.kv_cache_bytes, " is less than one KV block (",
        block_bytes, " bytes for ", config.block_size_tokens, " tokens of every layer)"));
  }
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<CpuRunner> runner(new CpuRunner(model, config));
  if (absl::Status s = runner->LoadWeights(checkpoint); !s.ok()) return s;

  runner->num_blocks_ = static_cast<int32_t>(num_blocks);
  runner->layer_cache_floats_ = num_blocks * config.block_size_tokens * runner->kv_dim_;
  const size_t pool_floats =
      static_cast<size_t>(2 * model.num_layers * runner->layer_cache_floats_);
  runner->kv_pool_.reset(static_cast<float*>(std::calloc(pool_floats, sizeof(float))));
  if (runner->kv_pool_ == nullptr) {
    return absl::ResourceExhaustedError(StrCat("CPU runner: cannot allocate a KV cache of ",
                                               pool_floats * sizeof(float), " bytes"));
  }
  kernels::SetBlasThreads(runner->num_threads_);
  runner->startup_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

void CpuRunner::EnsureWorkspace(int64_t num_tokens, int64_t max_context_len) {
  const ModelConfig& c = config_;
  Grow(&residual_, num_tokens * c.hidden_size);
  Grow(&normed_, num_tokens * c.hidden_size);
  Grow(&qkv_, num_tokens * qkv_dim_);
  Grow(&attention_, num_tokens * q_dim_);
  Grow(&projected_, num_tokens * c.hidden_size);
  Grow(&gate_up_, num_tokens * 2 * c.intermediate_size);
  Grow(&activation_, num_tokens * c.intermediate_size);
  Grow(&positions_, num_tokens);
  Grow(&slots_, num_tokens);
  Grow(&logits_rows_, num_tokens);
  Grow(&attention_scratch_,
       kernels::PagedAttentionParams::WorkspaceFloats(max_context_len, c.num_attention_heads,
                                                      c.num_kv_heads, num_threads_));
}

void CpuRunner::RunLayer(int64_t layer, const StepBatch& batch, int64_t num_tokens,
                         int64_t max_context_len) {
  const ModelConfig& c = config_;
  const LayerWeights& w = layers_[layer];
  const int64_t hidden = c.hidden_size;

  // Pre-attention norm; from the second layer on it also adds the previous MLP's output.
  if (layer == 0) {
    kernels::RmsNorm({.input = residual_.data(),
                      .weight = w.input_norm.data(),
                      .output = normed_.data(),
                      .num_tokens = num_tokens,
                      .hidden_size = hidden,
                      .epsilon = c.rms_norm_eps});
  } else {
    kernels::FusedAddRmsNorm({.residual = residual_.data(),
                              .input = projected_.data(),
                              .weight = w.input_norm.data(),
                              .output = normed_.data(),
                              .num_tokens = num_tokens,
                              .hidden_size = hidden,
                              .epsilon = c.rms_norm_eps});
  }
  kernels::Linear({.input = normed_.data(),
                   .weight = w.qkv.data(),
                   .bias = w.qkv_bias.empty() ? nullptr : w.qkv_bias.data(),
                   .output = qkv_.data(),
                   .num_tokens = num_tokens,
                   .in_features = hidden,
                   .out_features = qkv_dim_});
  kernels::ApplyRotary({.query = qkv_.data(),
                        .key = qkv_.data() + q_dim_,
                        .positions = positions_.data(),
                        .inv_freq = inv_freq_.data(),
                        .num_tokens = num_tokens,
                        .num_heads = c.num_attention_heads,
                        .num_kv_heads = c.num_kv_heads,
                        .head_dim = c.head_dim,
                        .query_stride = qkv_dim_,
                        .key_stride = qkv_dim_,
                        .layout = rotary_layout_});
  kernels::WriteKvCache({.key = qkv_.data() + q_dim_,
                         .value = qkv_.data() + q_dim_ + kv_dim_,
                         .slot_mapping = slots_.data(),
                         .key_cache = KeyCache(layer),
                         .value_cache = ValueCache(layer),
                         .num_tokens = num_tokens,
                         .num_kv_heads = c.num_kv_heads,
                         .head_dim = c.head_dim,
                         .block_size = block_size_,
                         .num_blocks = num_blocks_,
                         .key_stride = qkv_dim_,
                         .value_stride = qkv_dim_});
  kernels::PagedAttention(
      {.query = qkv_.data(),
       .key_cache = KeyCache(layer),
       .value_cache = ValueCache(layer),
       .query_start = batch.query_start.data(),
       .context_lens = batch.context_lens.data(),
       .block_table_start = batch.block_table_start.data(),
       .block_table_ids = batch.block_table_ids.data(),
       .output = attention_.data(),
       .workspace = attention_scratch_.data(),
       .num_seqs = batch.num_seqs(),
       .num_tokens = num_tokens,
       .num_heads = c.num_attention_heads,
       .num_kv_heads = c.num_kv_heads,
       .head_dim = c.head_dim,
       .block_size = block_size_,
       .num_blocks = num_blocks_,
       .query_stride = qkv_dim_,
       .max_context_len = max_context_len,
       .scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim))),
       .num_threads = num_threads_});
  kernels::Linear({.input = attention_.data(),
                   .weight = w.o_proj.data(),
                   .output = projected_.data(),
                   .num_tokens = num_tokens,
                   .in_features = q_dim_,
                   .out_features = hidden});
  // residual += attention output; MLP.
  kernels::FusedAddRmsNorm({.residual = residual_.data(),
                            .input = projected_.data(),
                            .weight = w.post_norm.data(),
                            .output = normed_.data(),
                            .num_tokens = num_tokens,
                            .hidden_size = hidden,
                            .epsilon = c.rms_norm_eps});
  kernels::Linear({.input = normed_.data(),
                   .weight = w.gate_up.data(),
                   .output = gate_up_.data(),
                   .num_tokens = num_tokens,
                   .in_features = hidden,
                   .out_features = 2 * c.intermediate_size});
  kernels::SiluAndMul({.gate_up = gate_up_.data(),
                       .output = activation_.data(),
                       .num_tokens = num_tokens,
                       .intermediate_size = c.intermediate_size});
  kernels::Linear({.input = activation_.data(),
                   .weight = w.down.data(),
                   .output = projected_.data(),
                   .num_tokens = num_tokens,
                   .in_features = c.intermediate_size,
                   .out_features = hidden});
}

absl::Status CpuRunner::Execute(const StepBatch& batch, StepOutput* output) {
  if (absl::Status s = ValidateStepBatch(batch, config_, block_size_, num_blocks_); !s.ok()) {
    return s;
  }
  const ModelConfig& c = config_;
  const int64_t num_seqs = batch.num_seqs();
  const int64_t num_tokens = batch.num_tokens();

  // Plan the step: positions, cache slots, the rows that need logits.
  int64_t max_context_len = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    max_context_len = std::max<int64_t>(max_context_len, batch.context_lens[i]);
  }
  EnsureWorkspace(num_tokens, max_context_len);
  output->logits_row_start.resize(static_cast<size_t>(num_seqs + 1));
  output->logits_row_start[0] = 0;
  output->sampled_tokens.assign(static_cast<size_t>(num_seqs), -1);
  sample_seqs_.clear();
  int64_t num_rows = 0;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int32_t begin = batch.query_start[i];
    const int32_t end = batch.query_start[i + 1];
    const int32_t first_position = batch.context_lens[i] - (end - begin);
    const int32_t* table = batch.block_table_ids.data() + batch.block_table_start[i];
    for (int32_t t = begin; t < end; ++t) {
      const int32_t position = first_position + (t - begin);
      positions_[t] = position;
      slots_[t] = int64_t{table[position / block_size_]} * block_size_ + position % block_size_;
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
  output->logits.resize(static_cast<size_t>(num_rows * c.vocab_size));
  // kSample rows go after the returned ones; their logits stay here.
  const int64_t num_returned_rows = num_rows;
  for (int32_t i : sample_seqs_) logits_rows_[num_rows++] = batch.query_start[i + 1] - 1;
  if (num_tokens == 0) return absl::OkStatus();

  kernels::EmbeddingGather({.table = embed_.data(),
                            .ids = batch.token_ids.data(),
                            .output = residual_.data(),
                            .num_tokens = num_tokens,
                            .vocab_size = c.vocab_size,
                            .hidden_size = c.hidden_size});
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    RunLayer(layer, batch, num_tokens, max_context_len);
  }
  if (num_rows == 0) return absl::OkStatus();

  // The last MLP's residual add and the final norm, only for the logits rows, packed into normed_.
  const int64_t hidden = c.hidden_size;
  for (int64_t r = 0; r < num_rows; ++r) {
    const int64_t t = logits_rows_[r];
    kernels::FusedAddRmsNorm({.residual = residual_.data() + t * hidden,
                              .input = projected_.data() + t * hidden,
                              .weight = final_norm_.data(),
                              .output = normed_.data() + r * hidden,
                              .num_tokens = 1,
                              .hidden_size = hidden,
                              .epsilon = c.rms_norm_eps});
  }
  // lm_head, its reduction summed in double over fp32 chunks: logits of tied-embedding models
  // reach the hundreds, where fp32 sums over all of hidden lose 1e-4.
  if (num_returned_rows > 0) {
    kernels::Linear({.input = normed_.data(),
                     .weight = lm_head_,
                     .output = output->logits.data(),
                     .num_tokens = num_returned_rows,
                     .in_features = hidden,
                     .out_features = c.vocab_size,
                     .split_k = kLogitsSplitK,
                     .num_threads = num_threads_});
  }
  if (sample_seqs_.empty()) return absl::OkStatus();
  const int64_t num_sampled = static_cast<int64_t>(sample_seqs_.size());
  Grow(&sample_logits_, num_sampled * c.vocab_size);
  kernels::Linear({.input = normed_.data() + num_returned_rows * hidden,
                   .weight = lm_head_,
                   .output = sample_logits_.data(),
                   .num_tokens = num_sampled,
                   .in_features = hidden,
                   .out_features = c.vocab_size,
                   .split_k = kLogitsSplitK,
                   .num_threads = num_threads_});
  sample_temperature_.clear(), sample_top_p_.clear(), sample_min_p_.clear();
  sample_top_k_.clear(), sample_seeds_.clear(), sample_steps_.clear();
  for (int32_t i : sample_seqs_) {
    const RunnerSampling& s = batch.sampling[i];
    sample_temperature_.push_back(s.temperature);
    sample_top_k_.push_back(s.top_k);
    sample_top_p_.push_back(s.top_p);
    sample_min_p_.push_back(s.min_p);
    sample_seeds_.push_back(s.seed);
    sample_steps_.push_back(s.step);
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
                   .vocab_size = c.vocab_size});
  for (int64_t k = 0; k < num_sampled; ++k) {
    output->sampled_tokens[sample_seqs_[k]] = sample_tokens_[k];
  }
  return absl::OkStatus();
}

RunnerStats CpuRunner::stats() const {
  RunnerStats s;
  s.dtype = RunnerDType::kFloat32;
  auto bytes = [](const std::vector<float>& v) { return static_cast<int64_t>(v.size() * 4); };
  s.weight_bytes = bytes(embed_) + bytes(final_norm_) + bytes(lm_head_storage_);
  for (const LayerWeights& w : layers_) {
    s.weight_bytes += bytes(w.input_norm) + bytes(w.qkv) + bytes(w.qkv_bias) + bytes(w.o_proj) +
                      bytes(w.post_norm) + bytes(w.gate_up) + bytes(w.down);
  }
  s.kv_cache_bytes = 2 * config_.num_layers * layer_cache_floats_ * 4;
  s.startup_seconds = startup_seconds_;
  s.device_name = "cpu";
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCpuRunner(const Checkpoint& checkpoint,
                                                             const RunnerConfig& config) {
  return CpuRunner::Create(checkpoint, config);
}

int64_t CpuKvBlockBytes(const ModelConfig& config, int32_t block_size_tokens) {
  return 2 * config.num_layers * int64_t{block_size_tokens} * config.num_kv_heads *
         config.head_dim * static_cast<int64_t>(sizeof(float));
}

}  // namespace lmserve::engine
