// Llama (LlamaForCausalLM) and the families built the same way: a pre-norm decoder of RMSNorm,
// rotary attention with grouped K/V heads and a SiLU-gated MLP. Mistral (mistral.cc) and Qwen2
// (qwen2.cc) are Llama with their own names and config keys, and q/k/v biases for Qwen2; Mixtral
// (mixtral.cc) is Llama whose MLPs are mixtures of experts (ForwardOps::Moe).

#ifndef LMSERVE_ENGINE_MODEL_FAMILIES_LLAMA_H_
#define LMSERVE_ENGINE_MODEL_FAMILIES_LLAMA_H_

#include <memory>
#include <optional>
#include <vector>

#include "engine/model/family.h"

namespace lmserve::engine {

class LlamaDescription final : public ModelDescription {
 public:
  // REQUIRES: ValidateModelConfig(config).ok(). With `moe_names`, the layers that IsMoeLayer
  // names have a mixture of experts of those tensors instead of the dense MLP.
  explicit LlamaDescription(const ModelConfig& config,
                            const MoeTensorNames* moe_names = nullptr);

  absl::Status Forward(ForwardOps& ops) const override;

 private:
  struct Layer {
    Weight input_norm;  // [hidden]
    Weight qkv;         // [q_dim + 2 kv_dim, hidden]: q_proj, k_proj, v_proj stacked
    Weight o_proj;      // [hidden, q_dim]
    Weight post_norm;   // [hidden]
    Weight gate_up;     // [2 intermediate, hidden]: gate_proj, up_proj stacked
    Weight down;        // [hidden, intermediate]
    std::optional<MoeLayer> moe;  // instead of gate_up and down, in a sparse layer
    AttentionLayer attention;
  };
  Weight embed_;       // [vocab, hidden]
  Weight final_norm_;  // [hidden]
  Weight lm_head_;     // [vocab, hidden]: its own, or the embeddings when tied
  std::vector<Layer> layers_;
};

// The families whose model is a LlamaDescription (llama.cc, mistral.cc, qwen2.cc, mixtral.cc).
ModelFamily LlamaFamily();
ModelFamily MistralFamily();
ModelFamily Qwen2Family();
ModelFamily MixtralFamily();

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

// Caps the context at `sliding_window` when the config enables it (`use_sliding_window`, default
// `enabled_by_default`): until sliding-window attention exists, a model is served only within its
// window, so that its answers stay exact.
absl::Status CapContextAtSlidingWindow(const nlohmann::json& config, bool enabled_by_default,
                                       ModelConfig* out);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_MODEL_FAMILIES_LLAMA_H_
