// The operations a model family's forward pass is written in, and that every runner implements.
//
// A family (family.h) spells its layer order once, as calls on ForwardOps; the CPU runner and the
// CUDA runner each implement the ops, and neither spells a layer order of its own. The ops are
// coarse enough for a runner to keep its fusions below this line: the CUDA runner adds the bias,
// rotates and writes the cache in one kernel, fuses the MLP's activation into its small-batch
// GEMM, chains kernels by programmatic dependent launch and captures whole steps as CUDA graphs;
// the CPU runner computes only the rows that need logits after the last layer.
//
// Activations live in a runner's buffers, named by Buffer; each holds one row per token of the
// step. A step's inputs (token ids, positions, cache slots, block tables, the rows that need
// logits, the sampling settings) are the runner's: the ops read them implicitly.
//
// Calls are made by the runner's thread, in order; an op may return before its work is done
// (the CUDA runner only enqueues it), so an error may surface in a later op or at the step's end.

#ifndef LMSERVE_ENGINE_MODEL_OPS_H_
#define LMSERVE_ENGINE_MODEL_OPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "engine/model/model_config.h"
#include "engine/model/weight_plan.h"

namespace lmserve::engine {

// A step's activations, each [num_tokens, width] in the runner's element type. The residual
// stream may be held wider than the rest (the CUDA runner's fp32 residual beside bf16): a family
// names it only as Embed's output, RmsNorm's input and the residual of AddRmsNorm and FinalNorm.
enum class Buffer : uint8_t {
  kResidual,    // [hidden]: the residual stream
  kNormed,      // [hidden]: a norm's output, the next projection's input
  kQkv,         // [q_dim + 2 kv_dim]: the fused Q/K/V projection (q heads, k heads, v heads)
  kAttention,   // [q_dim]: attention's output
  kProjected,   // [hidden]: an output projection's result, added to the residual next
  kActivation,  // [intermediate]: the gated MLP's activation
  // State-space (Mamba-2) layers (SsmConfig; width 0 in models without them):
  kSsmIn,    // [ssm in_proj_dim]: in_proj's output: z (the gate), x B C, dt
  kSsmConv,  // [ssm conv_dim]: x B C after the causal conv1d and its SiLU
  kSsmOut,   // [ssm inner]: the scan's output, then the gated norm's
};
inline constexpr int kNumBuffers = 9;

// The width of `buffer`'s rows for `config`.
int64_t BufferWidth(Buffer buffer, const ModelConfig& config);

// The activation of a gated MLP: out = act(x Wg^T) * (x Wu^T).
enum class Activation : uint8_t {
  kSilu,      // x * sigmoid(x)
  kGeluTanh,  // GELU's tanh approximation (PyTorch's gelu(approximate="tanh"))
};

// One attention layer's attributes.
struct AttentionLayer {
  int64_t layer = 0;  // its KV cache layer
  int32_t rope = 0;   // which of the model's rotary embeddings (ModelDescription::rotary())
  float scale = 0;    // the score multiplier, usually 1 / sqrt(head_dim)
  Weight qkv_bias;    // [q_dim + 2 kv_dim], added to Q/K/V before rotary; optional
  // Per-head RMSNorm of the queries and keys (Qwen3, Gemma 3), after the bias and before rotary:
  // each head's head_dim values normed and multiplied by the [head_dim] weight. Optional (both or
  // neither); norm_epsilon is their epsilon.
  Weight q_norm;
  Weight k_norm;
  float norm_epsilon = 1e-6f;
  // Sliding-window attention: a query at position p attends to keys at positions
  // (p - window, p]. 0: every earlier position.
  int32_t window = 0;
  // Score soft-capping (Gemma 2): score = softcap * tanh(scale * q.k / softcap). 0: none.
  float softcap = 0;
};

// One mixture-of-experts MLP (Mixtral, Qwen3-MoE): each token's output is the weighted sum of
// top_k of num_experts gated MLPs, out = sum_k weight_k * down_e(act(x Wg_e^T) * (x Wu_e^T)) over
// the token's experts e = expert_k. The router scores every expert, router_logits = x R^T (fp32);
// weights = softmax over all num_experts logits; the top_k largest are taken (ties: the lower
// expert index), renormalized to sum to 1 when normalize_top_k (Mixtral always; Qwen3-MoE per
// norm_topk_prob).
struct MoeLayer {
  Weight router;   // [num_experts, hidden]
  Weight gate_up;  // [num_experts * 2 * intermediate, hidden]: expert e's gate rows, then its up
                   // rows, at rows [e * 2 intermediate, (e + 1) * 2 intermediate)
  Weight down;     // [num_experts * hidden, intermediate]: expert e's rows at
                   // [e * hidden, (e + 1) * hidden)
  int32_t num_experts = 0;
  int32_t top_k = 0;
  int64_t intermediate = 0;  // one expert's intermediate width
  bool normalize_top_k = true;
  Activation act = Activation::kSilu;
};

// One state-space (Mamba-2) mixer's attributes (SsmConfig gives the shapes). Its state, per
// sequence: the conv state (the last conv_kernel - 1 inputs of each x B C channel) and the SSM
// state h ([num_heads, head_dim, state_size], fp32), kept by the runner in the sequence's state
// slot (StepBatch::state_slots) and updated in place by each step. A sequence whose step starts at
// position 0 starts from zero state; a later step continues the state its slot holds.
struct SsmLayer {
  int64_t state_layer = 0;  // which of the model's state-space layers (its place in a state slot)
  Weight conv_weight;       // [conv_dim, conv_kernel]: channel c's taps, oldest input first
  Weight conv_bias;         // [conv_dim]; optional
  Weight dt_bias;           // [num_heads]
  Weight a_log;             // [num_heads]: A = -exp(a_log)
  Weight d;                 // [num_heads]: the skip connection y += D x
  Weight norm;              // [inner]: the gated RMSNorm's weight
  float norm_epsilon = 1e-5f;
};

class ForwardOps {
 public:
  virtual ~ForwardOps() = default;

  // residual = the rows of `table` ([vocab, hidden]) at the step's token ids, times `scale`
  // (Gemma's sqrt(hidden); 1 for most families).
  virtual absl::Status Embed(Weight table, float scale) = 0;
  // out = RMSNorm(in) * weight. `out` may be `in`.
  virtual absl::Status RmsNorm(Buffer in, Weight weight, float epsilon, Buffer out) = 0;
  // residual += add; out = RMSNorm(residual) * weight.
  virtual absl::Status AddRmsNorm(Buffer residual, Buffer add, Weight weight, float epsilon,
                                  Buffer out) = 0;
  // out = in W^T, W = `weight` ([out width, in width]).
  virtual absl::Status Linear(Weight weight, Buffer in, Buffer out) = 0;
  // out = act(in Wg^T) * (in Wu^T), where `gate_up` is [2 intermediate, hidden]: the gate rows,
  // then the up rows.
  virtual absl::Status GatedLinear(Weight gate_up, Activation act, Buffer in, Buffer out) = 0;
  // out = the mixture of experts `moe` of `in` (both [hidden] buffers; they may not alias).
  virtual absl::Status Moe(const MoeLayer& moe, Buffer in, Buffer out) = 0;
  // Adds layer.qkv_bias to `qkv`, rotates its queries and keys by the tokens' positions, and writes
  // its keys and values into the layer's cache slots of the step's tokens.
  virtual absl::Status RotaryAndCacheWrite(const AttentionLayer& layer, Buffer qkv) = 0;
  // out = causal attention of the step's (rotated) queries over the layer's cache, each sequence
  // over its own context.
  virtual absl::Status Attention(const AttentionLayer& layer, Buffer qkv, Buffer out) = 0;
  // State-space layers (SsmLayer). `in` is in_proj's output ([z, x B C, dt] per token).
  // conv = SiLU(causal depthwise conv1d of in's x B C channels, over the sequence's conv state
  // and its new tokens, + bias); the conv state then holds the last conv_kernel - 1 inputs.
  virtual absl::Status SsmConv(const SsmLayer& /*layer*/, Buffer /*in*/, Buffer /*conv*/) {
    return absl::UnimplementedError("this runner has no state-space layers");
  }
  // out = the SSD scan of conv's x, B and C with dt = clamp(softplus(in's dt + dt_bias)), A =
  // -exp(a_log): per head h (group g of h), h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T,
  // y_t = h_t C_t + D x_t, from the sequence's SSM state, which then holds the last h_t. Runners
  // may fuse it with SsmConv (an op may return before its work is done).
  virtual absl::Status SsmScan(const SsmLayer& /*layer*/, Buffer /*in*/, Buffer /*conv*/,
                                       Buffer /*out*/) {
    return absl::UnimplementedError("this runner has no state-space layers");
  }
  // out = RMSNorm over each of norm_groups groups of (y * SiLU(z)) times the weight, z the gate
  // of `in` (its first inner columns). `out` may be `y`.
  virtual absl::Status GatedRmsNorm(const SsmLayer& /*layer*/, Buffer /*in*/, Buffer /*y*/,
                                            Buffer /*out*/) {
    return absl::UnimplementedError("this runner has no state-space layers");
  }
  // For the rows that need logits: residual += add, then RMSNorm(residual) * weight, kept for
  // LmHead. (A runner may compute more rows; only these are read.)
  virtual absl::Status FinalNorm(Buffer residual, Buffer add, Weight weight, float epsilon) = 0;
  // The logits of those rows: the final norm's output times `lm_head` ([vocab, hidden]), fp32;
  // soft-capped when `softcap` > 0 (logit = softcap * tanh(logit / softcap), Gemma 2).
  virtual absl::Status LmHead(Weight lm_head, float softcap) = 0;
  // The sequences that asked the runner to pick their token (LogitsMode::kSample) draw it.
  virtual absl::Status Sample() = 0;
};

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_MODEL_OPS_H_
