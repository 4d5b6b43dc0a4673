// Llama (LlamaForCausalLM) and the families built the same way: a pre-norm decoder of RMSNorm,
// rotary attention with grouped K/V heads and a SiLU-gated MLP. Mistral (mistral.cc), Qwen2
// (qwen2.cc), Qwen3 (qwen3.cc) and Phi-3 (phi3.cc) are Llama with their own names and config keys:
// q/k/v biases for Qwen2, q/k norms for Qwen3, fused tensors and partial or longrope rotary for
// Phi-3; Mixtral (mixtral.cc) and Qwen3-MoE (qwen3.cc) are Llama and Qwen3 whose MLPs are mixtures
// of experts (ForwardOps::Moe). Gemma 2 and 3 (gemma.cc) share the attention parts declared here.

#ifndef LMSERVE_ENGINE_MODEL_FAMILIES_LLAMA_H_
#define LMSERVE_ENGINE_MODEL_FAMILIES_LLAMA_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/family.h"

namespace lmserve::engine {

// What sets a Llama-built family's tensors apart.
struct LlamaOptions {
  bool qk_norm = false;        // per-head q/k RMSNorm (Qwen3): self_attn.{q,k}_norm.weight
  bool fused_qkv = false;      // one self_attn.qkv_proj.weight (Phi-3)
  bool fused_gate_up = false;  // one mlp.gate_up_proj.weight (Phi-3)
  // The experts' tensors: the layers that IsMoeLayer names have a mixture of experts instead of
  // the dense MLP (Mixtral, Qwen3-MoE).
  std::optional<MoeTensorNames> moe_names;
};

class LlamaDescription final : public ModelDescription {
 public:
  // REQUIRES: ValidateModelConfig(config).ok().
  explicit LlamaDescription(const ModelConfig& config, const LlamaOptions& options = {});

  absl::Status Forward(ForwardOps& ops) const override;

 private:
  struct Layer {
    Weight input_norm;            // [hidden]
    Weight qkv;                   // [q_dim + 2 kv_dim, hidden]: q_proj, k_proj, v_proj stacked
    Weight o_proj;                // [hidden, q_dim]
    Weight post_norm;             // [hidden]
    Weight gate_up;               // [2 intermediate, hidden]: gate_proj, up_proj stacked
    Weight down;                  // [hidden, intermediate]
    std::optional<MoeLayer> moe;  // instead of gate_up and down, in a sparse layer
    AttentionLayer attention;
  };
  Weight embed_;       // [vocab, hidden]
  Weight final_norm_;  // [hidden]
  Weight lm_head_;     // [vocab, hidden]: its own, or the embeddings when tied
  std::vector<Layer> layers_;
};

// Parts shared by the descriptions of decoder families (llama.cc, gemma.cc).
//
// The rotary embeddings of `config`: its own (longrope resolved for its context), then its local
// layers' when it has one (Gemma 3).
std::vector<RopeConfig> DecoderRotary(const ModelConfig& config);
// Layer `layer`'s attention attributes from the config: its cache layer, rotary embedding, window,
// query scale and soft-cap (no weights).
AttentionLayer DecoderAttention(const ModelConfig& config, int64_t layer);
// The rows of a rank's K or V projection and the slices of the checkpoint's they are one of
// (ModelConfig::tensor_parallel_kv_slices).
RowSlices KvRows(const ModelConfig& config);
// The q_proj, k_proj and v_proj parts of `layer`'s fused QKV weight ("weight") or bias ("bias").
std::vector<WeightPart> QkvParts(const ModelConfig& config, int64_t layer, std::string_view suffix);
// Declares the fused QKV projection of `layer` ([q_dim + 2 kv_dim, hidden], from q/k/v_proj or
// one qkv_proj), and, with `qk_norm`, the q/k norm weights into `attention` (offset: their load
// offset, as ModelConfig::norm_weight_offset).
Weight AddQkv(WeightPlan& plan, const ModelConfig& config, int64_t layer, bool fused, bool qk_norm,
              AttentionLayer* attention);
// The tensors outside the layers: the embeddings, the final norm and the LM head (its own, or the
// embeddings when tied). Declared before the layers: checks find missing tensors in this order,
// and the CUDA runner lays its weights out in it.
struct DecoderEnds {
  Weight embed;       // [vocab, hidden] (a rank's VocabShardRows under tensor parallelism)
  Weight final_norm;  // [hidden]
  Weight lm_head;     // [vocab, hidden]
};
DecoderEnds AddDecoderEnds(WeightPlan& plan, const ModelConfig& config);
// Declares the gated MLP's [2 intermediate, hidden] gate/up matrix of `layer`: gate_proj then
// up_proj, or one gate_up_proj (`fused`, Phi-3).
Weight AddGateUp(WeightPlan& plan, const ModelConfig& config, int64_t layer, bool fused);
// Declares the MLP's down projection [hidden, intermediate] and the attention's output projection
// [hidden, q_dim] of `layer`: row-parallel under tensor parallelism (their outputs all-reduced).
Weight AddDown(WeightPlan& plan, const ModelConfig& config, int64_t layer);
Weight AddOutputProjection(WeightPlan& plan, const ModelConfig& config, int64_t layer);
// Declares a [hidden] RMSNorm weight of `layer` (-1: outside the layers) named `name`.
Weight AddNorm(WeightPlan& plan, const ModelConfig& config, std::string kind, int64_t layer,
               std::string name);

// The families whose model is a LlamaDescription (llama.cc, mistral.cc, qwen2.cc, qwen3.cc,
// phi3.cc, mixtral.cc), and Gemma's (gemma.cc).
ModelFamily LlamaFamily();
ModelFamily MistralFamily();
ModelFamily Qwen2Family();
ModelFamily Qwen3Family();
ModelFamily Phi3Family();
ModelFamily Gemma2Family();
ModelFamily Gemma3Family();
ModelFamily MixtralFamily();
ModelFamily Qwen3MoeFamily();

// Declares layer `layer`'s mixture of experts (config's experts, names' tensors) in `plan`: the
// router, every expert's gate and up projections stacked into one [E * 2 I, hidden] matrix and
// their down projections into one [E * hidden, I] matrix (MoeLayer's layout). For any family with
// sparse layers (Mixtral here; Qwen3-MoE on the Qwen3 description).
MoeLayer DeclareMoeLayer(WeightPlan& plan, const ModelConfig& config, int64_t layer,
                         const MoeTensorNames& names);

// The Hugging Face names of the experts of Mixtral (block_sparse_moe.gate, experts.E.w1/w3/w2) and
// of Qwen3-MoE (mlp.gate, mlp.experts.E.gate_proj/up_proj/down_proj): ModelFamily::moe_names.
MoeTensorNames MixtralMoeNames();
MoeTensorNames Qwen3MoeNames();

// Reads a Hugging Face config's mixture-of-experts keys: `num_experts_key` (Mixtral's
// num_local_experts, Qwen3-MoE's num_experts), num_experts_per_tok, moe_intermediate_size (else
// intermediate_size), norm_topk_prob (else `default_norm_topk_prob`), decoder_sparse_step and
// mlp_only_layers.
absl::Status ReadHfMoeConfig(const nlohmann::json& config, const char* num_experts_key,
                             bool default_norm_topk_prob, ModelConfig* out);

// ModelFamily::describe of those families.
std::unique_ptr<ModelDescription> DescribeLlama(const ModelConfig& config);

// config.json checks those families share: hidden_act must be silu; attention_bias and mlp_bias
// must not be true.
absl::Status RequireSiluActivation(const nlohmann::json& config);
absl::Status RejectBiases(const nlohmann::json& config);

// Reads `sliding_window` into out->sliding_window when the config enables it
// (`use_sliding_window`, default `enabled_by_default`); every layer uses it unless the family sets
// out->sliding_layers.
absl::Status ReadSlidingWindow(const nlohmann::json& config, bool enabled_by_default,
                               ModelConfig* out);
// Qwen2 and Qwen3: `use_sliding_window` (off by default) for the layers from `max_window_layers`.
absl::Status ReadQwenSlidingWindow(const nlohmann::json& config, ModelConfig* out);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_MODEL_FAMILIES_LLAMA_H_
