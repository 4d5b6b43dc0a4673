// Llama (LlamaForCausalLM) and the families built the same way: a pre-norm decoder of RMSNorm,
// rotary attention with grouped K/V heads and a SiLU-gated MLP. Mistral (mistral.cc), Qwen2
// (qwen2.cc), Qwen3 (qwen3.cc) and Phi-3 (phi3.cc) are Llama with their own names and config keys:
// q/k/v biases for Qwen2, q/k norms for Qwen3, fused tensors and partial or longrope rotary for
// Phi-3. Gemma 2 and 3 (gemma.cc) share the attention parts declared here.

#ifndef LMSERVE_ENGINE_MODEL_FAMILIES_LLAMA_H_
#define LMSERVE_ENGINE_MODEL_FAMILIES_LLAMA_H_

#include <memory>
#include <string>
#include <vector>

#include "engine/model/family.h"

namespace lmserve::engine {

// What sets a Llama-built family's tensors apart.
struct LlamaOptions {
  bool qk_norm = false;        // per-head q/k RMSNorm (Qwen3): self_attn.{q,k}_norm.weight
  bool fused_qkv = false;      // one self_attn.qkv_proj.weight (Phi-3)
  bool fused_gate_up = false;  // one mlp.gate_up_proj.weight (Phi-3)
};

class LlamaDescription final : public ModelDescription {
 public:
  // REQUIRES: ValidateModelConfig(config).ok().
  explicit LlamaDescription(const ModelConfig& config, const LlamaOptions& options = {});

  absl::Status Forward(ForwardOps& ops) const override;

 private:
  struct Layer {
    Weight input_norm;  // [hidden]
    Weight qkv;         // [q_dim + 2 kv_dim, hidden]: q_proj, k_proj, v_proj stacked
    Weight o_proj;      // [hidden, q_dim]
    Weight post_norm;   // [hidden]
    Weight gate_up;     // [2 intermediate, hidden]: gate_proj, up_proj stacked
    Weight down;        // [hidden, intermediate]
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
// Declares the fused QKV projection of `layer` ([q_dim + 2 kv_dim, hidden], from q/k/v_proj or
// one qkv_proj), and, with `qk_norm`, the q/k norm weights into `attention` (offset: their load
// offset, as ModelConfig::norm_weight_offset).
Weight AddQkv(WeightPlan& plan, const ModelConfig& config, int64_t layer, bool fused, bool qk_norm,
              AttentionLayer* attention);
// Declares a [hidden] RMSNorm weight of `layer` (-1: outside the layers) named `name`.
Weight AddNorm(WeightPlan& plan, const ModelConfig& config, std::string kind, int64_t layer,
               std::string name);

// The families whose model is a LlamaDescription (llama.cc, mistral.cc, qwen2.cc, qwen3.cc,
// phi3.cc), and Gemma's (gemma.cc).
ModelFamily LlamaFamily();
ModelFamily MistralFamily();
ModelFamily Qwen2Family();
ModelFamily Qwen3Family();
ModelFamily Phi3Family();
ModelFamily Gemma2Family();
ModelFamily Gemma3Family();

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
