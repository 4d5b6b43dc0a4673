// The shape and hyper-parameters of a decoder model, whatever file it came from. Which family
// (family.h) it belongs to decides how its tensors and layers are read from these.

#ifndef LMSERVE_ENGINE_MODEL_MODEL_CONFIG_H_
#define LMSERVE_ENGINE_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace lmserve::engine {

enum class RopeScaling { kDefault, kLinear, kLlama3, kLongRope };

// How rotary embedding pairs the dimensions of a head.
enum class RopeLayout {
  kHalfSplit,    // dims i and i + head_dim/2 (Hugging Face, GPT-NeoX)
  kInterleaved,  // dims 2i and 2i + 1 (GPT-J; llama.cpp's layout for llama-architecture GGUF)
};

struct RopeConfig {
  double theta = 10000.0;
  RopeScaling scaling = RopeScaling::kDefault;
  double factor = 1.0;                              // linear and llama3
  double low_freq_factor = 1.0;                     // llama3
  double high_freq_factor = 4.0;                    // llama3
  int64_t original_max_position_embeddings = 8192;  // llama3, longrope
  RopeLayout layout = RopeLayout::kHalfSplit;
  // The leading dims of a head that rotate (Phi-3's partial_rotary_factor); the rest pass through.
  // 0: all of head_dim.
  int64_t rotary_dim = 0;
  // Per-frequency divisors, rotary_dim / 2 of them, when the file gives them explicitly (GGUF's
  // rope_freqs tensor). Empty: derived from `scaling`.
  std::vector<float> freq_factors;
  // longrope (Phi-3): per-frequency divisors for contexts up to original_max_position_embeddings
  // (short) and beyond (long); which apply is fixed by the context the model is served at, as
  // llama.cpp decides (RopeForContext).
  std::vector<float> short_factors;
  std::vector<float> long_factors;
  // Multiplies cos and sin (longrope's attention scaling; 1 otherwise). The config readers derive
  // longrope's from the context extension, as Hugging Face does, unless the file gives it.
  double attention_factor = 1.0;
};

// The state-space (Mamba-2) layers of a model: each a mixer of in_proj, a causal depthwise conv1d
// over its x, B and C channels, the SSD scan over num_heads heads of head_dim with a state of
// state_size per head dim, B and C shared by the heads of one of n_groups groups, a gated RMSNorm
// and out_proj. A sequence carries per layer a conv state (the last conv_kernel - 1 inputs of
// every conv channel) and an SSM state ([num_heads, head_dim, state_size]) from step to step.
struct SsmConfig {
  int64_t num_heads = 0;  // 0: the model has no state-space layers
  int64_t head_dim = 0;
  int64_t state_size = 0;
  int64_t n_groups = 1;
  int64_t conv_kernel = 4;
  int64_t chunk_size = 256;  // the SSD scan's chunk (a runner may choose its own)
  // The gated RMSNorm normalizes groups of this many features (inner() / norm_groups):
  // transformers' Mamba2 normalizes all of inner() (1 group); mamba_ssm and llama.cpp n_groups.
  int64_t norm_groups = 1;
  bool conv_bias = true;
  // dt is clamped to [time_step_min, time_step_max] after its softplus (Hugging Face's
  // time_step_limit; (0, inf) by default).
  double time_step_min = 0.0;
  double time_step_max = 0.0;  // 0: no upper limit

  int64_t inner() const { return num_heads * head_dim; }  // d_inner = expand * hidden
  int64_t conv_dim() const { return inner() + 2 * n_groups * state_size; }  // x, B, C
  // in_proj's output: z (the gate, inner), x B C (conv_dim), dt (num_heads).
  int64_t in_proj_dim() const { return inner() + conv_dim() + num_heads; }
  // The floats of one layer's state of one sequence: conv then SSM state.
  int64_t conv_state_floats() const { return (conv_kernel - 1) * conv_dim(); }
  int64_t ssm_state_floats() const { return num_heads * head_dim * state_size; }
};

// A checkpoint's FP8 (E4M3) weights, from config.json's quantization_config. Each F8_E4M3 tensor
// `<prefix>.weight` comes with its fp32/bf16 scales, the dequantized value being scale * q:
// - compressed-tensors (quant_method "compressed-tensors", float weights of 8 bits: the `*-FP8`
//   and `*-FP8-dynamic` models) and vLLM's own "fp8" without a block size: `<prefix>.weight_scale`,
//   one value (per tensor) or one per output channel ([rows] or [rows, 1]);
// - block-wise (quant_method "fp8" with weight_block_size [128, 128], as DeepSeek-V3 and
//   Qwen3-*-FP8): `<prefix>.weight_scale_inv`, [ceil(rows / 128), ceil(cols / 128)], one per
//   block (despite its name, a multiplier too).
// Activation scales (`input_scale`, static) are not read: activations are scaled per token at
// run time.
struct Fp8CheckpointConfig {
  bool present = false;
  std::string method;       // "compressed-tensors" or "fp8", for messages
  int64_t block_rows = 0;   // weight_block_size; 0: per-tensor or per-channel `weight_scale`
  int64_t block_cols = 0;

  // The scale tensor's name for the weight tensor `weight_name` ("....weight").
  std::string ScaleName(const std::string& weight_name) const;
};

struct ModelConfig {
  std::string family = "llama";   // the ModelFamily's name: "llama", "mistral", "qwen2", ...
  std::string architecture_name;  // as the file names it: "LlamaForCausalLM", "qwen2", ...
  std::string name;               // a human-readable model name, when the file has one
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;  // the context length
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // q/k/v projections carry a bias (Qwen2)
  // Mixture of experts (Mixtral, Qwen3-MoE): a sparse layer's MLP is num_experts gated MLPs of
  // moe_intermediate_size each, of which a router picks num_experts_per_tok per token
  // (IsMoeLayer says which layers). num_experts 0: every layer is dense.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = true;  // the top-k routing weights are renormalized to sum to 1
  // Qwen3-MoE's layout of sparse layers: layer l is sparse when it is not in mlp_only_layers and
  // (l + 1) % decoder_sparse_step == 0.
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  RopeConfig rope;
  // State-space layers (Mamba-2): their shape, and by layer whether it is one (empty: every layer
  // is when ssm.num_heads > 0). A model of only state-space layers has no attention fields
  // (num_attention_heads, num_kv_heads, head_dim and intermediate_size are 0).
  SsmConfig ssm;
  std::vector<bool> ssm_layers;
  // Sliding-window attention: the window in tokens (0: none) and, by layer, whether the layer uses
  // it (empty: every layer does). Gemma's local layers also rotate by their own embedding.
  int32_t sliding_window = 0;
  std::vector<bool> sliding_layers;
  std::optional<RopeConfig> local_rope;
  // Gemma: the query scale is query_pre_attn_scalar^-1/2 (0: head_dim^-1/2); soft-caps of the
  // attention scores and the final logits (0: none).
  double query_pre_attn_scalar = 0;
  double attn_logit_softcap = 0;
  double final_logit_softcap = 0;
  // Added to RMSNorm weights as the checkpoint stores them: Gemma's Hugging Face checkpoints store
  // w for a scale of 1 + w (offset 1); llama.cpp's GGUF files store the scale itself (offset 0).
  double norm_weight_offset = 0;
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;  // any of these ends generation
  // Tensor parallelism (ShardModelConfig): the config of rank `tensor_parallel_rank` of
  // `tensor_parallel_size`, whose num_attention_heads, num_kv_heads, intermediate_size and
  // moe_intermediate_size are the rank's share of the model's; vocab_size and the rest are the
  // model's own. 1 and 0: the whole model.
  int32_t tensor_parallel_size = 1;
  int32_t tensor_parallel_rank = 0;
  // The model's KV heads split into this many slices, one a rank (KvSlices): the tensor parallel
  // size, or the model's num_kv_heads when there are fewer KV heads than ranks (each rank then
  // holds one, shared with other ranks).
  int64_t tensor_parallel_kv_slices = 1;
  // The checkpoint's FP8 weights (Hugging Face safetensors only); present false: none.
  Fp8CheckpointConfig fp8;
};

// Parses a Hugging Face config.json (and, when given, generation_config.json, whose eos/bos ids
// win): the keys every family shares, then its family's own (ModelFamily::read_hf_config). Errors
// say what is unsupported: an architecture no family serves, a rope_scaling type, an inconsistent
// shape.
absl::StatusOr<ModelConfig> ParseHfConfig(const nlohmann::json& config,
                                          const nlohmann::json* generation_config);

// `base` with a Hugging Face rope_scaling / rope_parameters object applied (its rope_type,
// rope_theta and scaling keys): for families whose layers rotate differently (Gemma 3).
absl::StatusOr<RopeConfig> ParseRopeParameters(const nlohmann::json& parameters, RopeConfig base);

// Checks the invariants every runner relies on (positive sizes, heads dividing evenly, ...).
absl::Status ValidateModelConfig(const ModelConfig& config);

// Rank `rank`'s share of `config` under tensor parallelism of `size` ranks (Megatron's split: each
// rank holds num_attention_heads / size query heads with their KV heads (num_kv_heads / size, or
// one KV head replicated where size is a multiple of num_kv_heads), intermediate_size / size of
// every MLP and of every expert, and a slice of the vocabulary, VocabShardRows). Errors name
// what `size` does not divide. REQUIRES: config is the whole model's.
absl::StatusOr<ModelConfig> ShardModelConfig(const ModelConfig& config, int32_t size,
                                             int32_t rank);

// The vocabulary rows each rank's embedding and LM head hold: ceil(vocab_size / size), the last
// rank's padded with zero rows.
int64_t VocabShardRows(const ModelConfig& config);

// Whether decoder layer `layer` is a state-space (Mamba) layer, and how many of the model's are
// (each holds one recurrent state per running sequence).
bool IsSsmLayer(const ModelConfig& config, int64_t layer);
int64_t NumSsmLayers(const ModelConfig& config);
// Whether any layer is an attention layer (then the attention fields must be valid).
bool HasAttentionLayers(const ModelConfig& config);

// Whether decoder layer `layer` has a mixture-of-experts MLP (ModelConfig::num_experts).
bool IsMoeLayer(const ModelConfig& config, int64_t layer);

// The inverse frequency of each rotary pair i in [0, rotary_dim/2), scaling applied: what rotary
// embedding multiplies positions by. fp64 so that CPU and GPU tables agree to the last fp32 bit.
// longrope: the short factors (RopeForContext picks).
std::vector<double> RopeInverseFrequencies(const RopeConfig& rope, int64_t head_dim);

// longrope's attention factor as Hugging Face derives it when the config gives none: from the
// extension the model was trained to, max_position_embeddings over the original context;
// sqrt(1 + ln(extension) / ln(original)), 1 without an extension.
double LongRopeAttentionFactor(int64_t max_position_embeddings,
                               int64_t original_max_position_embeddings);

// The dims of a head that `rope` rotates: rotary_dim, or head_dim when 0.
int64_t RotaryDim(const RopeConfig& rope, int64_t head_dim);

// `rope` as served at a context of `context_len` tokens: longrope takes its long factors beyond
// original_max_position_embeddings and its short ones within (llama.cpp's rule; Hugging Face
// switches by the length of the sequence so far, which agrees with it for sequences that stay on
// one side), as explicit freq_factors; other scalings are returned as they are.
RopeConfig RopeForContext(const RopeConfig& rope, int64_t context_len);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_MODEL_MODEL_CONFIG_H_
