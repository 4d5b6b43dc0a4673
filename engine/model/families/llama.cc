#include "engine/model/families/llama.h"

#include <cmath>

#include "common/status.h"
#include "common/strings.h"
#include "engine/model/checkpoint.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine {

LlamaDescription::LlamaDescription(const ModelConfig& c) : ModelDescription(c) {
  rotary_ = {c.rope};
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
  const int64_t q_dim = c.num_attention_heads * c.head_dim, kv_dim = c.num_kv_heads * c.head_dim;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  WeightPlan& w = weights_;
  embed_ = w.AddTensor("embed_tokens", -1, "model.embed_tokens.weight", c.vocab_size, hidden);
  // The final norm and the LM head come before the layers: checks find missing tensors in this
  // order, and the CUDA runner lays its weights out in it.
  final_norm_ = w.AddTensor("norm", -1, "model.norm.weight", hidden);
  lm_head_ = c.tie_word_embeddings
                 ? w.AddTied("lm_head", embed_)
                 : w.AddTensor("lm_head", -1, "lm_head.weight", c.vocab_size, hidden);
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    auto name = [l](std::string_view suffix) { return LayerTensorName(l, suffix); };
    Layer& layer = layers_[l];
    layer.input_norm = w.AddTensor("input_layernorm", l, name("input_layernorm.weight"), hidden);
    layer.qkv = w.Add("qkv", l, q_dim + 2 * kv_dim, hidden,
                      {{name("self_attn.q_proj.weight"), q_dim},
                       {name("self_attn.k_proj.weight"), kv_dim},
                       {name("self_attn.v_proj.weight"), kv_dim}});
    layer.attention.layer = l;
    layer.attention.scale = scale;
    if (c.attention_bias) {
      layer.attention.qkv_bias = w.Add("qkv_bias", l, q_dim + 2 * kv_dim, 0,
                                       {{name("self_attn.q_proj.bias"), q_dim},
                                        {name("self_attn.k_proj.bias"), kv_dim},
                                        {name("self_attn.v_proj.bias"), kv_dim}});
    }
    layer.o_proj = w.AddTensor("o_proj", l, name("self_attn.o_proj.weight"), hidden, q_dim);
    layer.post_norm =
        w.AddTensor("post_attention_layernorm", l, name("post_attention_layernorm.weight"), hidden);
    layer.gate_up =
        w.Add("gate_up", l, 2 * inter, hidden,
              {{name("mlp.gate_proj.weight"), inter}, {name("mlp.up_proj.weight"), inter}});
    layer.down = w.AddTensor("down_proj", l, name("mlp.down_proj.weight"), hidden, inter);
  }
}

absl::Status LlamaDescription::Forward(ForwardOps& ops) const {
  const float eps = static_cast<float>(config_.rms_norm_eps);
  LMSERVE_RETURN_IF_ERROR(ops.Embed(embed_));
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& layer = layers_[l];
    if (l == 0) {  // nothing to add to the embeddings yet
      LMSERVE_RETURN_IF_ERROR(
          ops.RmsNorm(Buffer::kResidual, layer.input_norm, eps, Buffer::kNormed));
    } else {  // the previous layer's MLP output joins the residual stream
      LMSERVE_RETURN_IF_ERROR(ops.AddRmsNorm(Buffer::kResidual, Buffer::kProjected,
                                             layer.input_norm, eps, Buffer::kNormed));
    }
    LMSERVE_RETURN_IF_ERROR(ops.Linear(layer.qkv, Buffer::kNormed, Buffer::kQkv));
    LMSERVE_RETURN_IF_ERROR(ops.RotaryAndCacheWrite(layer.attention, Buffer::kQkv));
    LMSERVE_RETURN_IF_ERROR(ops.Attention(layer.attention, Buffer::kQkv, Buffer::kAttention));
    LMSERVE_RETURN_IF_ERROR(ops.Linear(layer.o_proj, Buffer::kAttention, Buffer::kProjected));
    LMSERVE_RETURN_IF_ERROR(ops.AddRmsNorm(Buffer::kResidual, Buffer::kProjected, layer.post_norm,
                                           eps, Buffer::kNormed));
    LMSERVE_RETURN_IF_ERROR(
        ops.GatedLinear(layer.gate_up, Activation::kSilu, Buffer::kNormed, Buffer::kActivation));
    LMSERVE_RETURN_IF_ERROR(ops.Linear(layer.down, Buffer::kActivation, Buffer::kProjected));
  }
  LMSERVE_RETURN_IF_ERROR(ops.FinalNorm(Buffer::kResidual, Buffer::kProjected, final_norm_, eps));
  LMSERVE_RETURN_IF_ERROR(ops.LmHead(lm_head_));
  return ops.Sample();
}

absl::Status CapContextAtSlidingWindow(const nlohmann::json& config, bool enabled_by_default,
                                       ModelConfig* out) {
  bool enabled = enabled_by_default;
  if (auto it = config.find("use_sliding_window"); it != config.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return absl::InvalidArgumentError("config.json: 'use_sliding_window' is not a boolean");
    }
    enabled = it->get<bool>();
  }
  int64_t window = 0;
  if (auto it = config.find("sliding_window"); it != config.end() && !it->is_null()) {
    if (!it->is_number_integer()) {
      return absl::InvalidArgumentError("config.json: 'sliding_window' is not an integer");
    }
    window = it->get<int64_t>();
  }
  if (enabled && window > 0 && window < out->max_position_embeddings) {
    out->max_position_embeddings = window;
  }
  return absl::OkStatus();
}

absl::Status RequireSiluActivation(const nlohmann::json& config) {
  auto it = config.find("hidden_act");
  if (it == config.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string())
    return absl::InvalidArgumentError("config.json: 'hidden_act' is not a string");
  if (it->get<std::string>() != "silu") {
    return absl::UnimplementedError(StrCat("config.json: hidden_act '", it->get<std::string>(),
                                           "' is not supported (only silu)"));
  }
  return absl::OkStatus();
}

absl::Status RejectBiases(const nlohmann::json& config) {
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    if (!it->is_boolean()) {
      return absl::InvalidArgumentError(StrCat("config.json: '", key, "' is not a boolean"));
    }
    if (it->get<bool>()) {
      return absl::UnimplementedError(
          "config.json: attention_bias / mlp_bias on a Llama model are not supported");
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<ModelDescription> DescribeLlama(const ModelConfig& config) {
  return std::make_unique<LlamaDescription>(config);
}

ModelFamily LlamaFamily() {
  ModelFamily family;
  family.name = "llama";
  family.hf_architectures = {"LlamaForCausalLM"};
  family.hf_model_types = {"llama"};
  family.gguf_architecture = "llama";
  family.gguf_rope_layout = RopeLayout::kInterleaved;
  family.read_hf_config = [](const nlohmann::json& config, ModelConfig* out) {
    LMSERVE_RETURN_IF_ERROR(RequireSiluActivation(config));
    LMSERVE_RETURN_IF_ERROR(RejectBiases(config));
    return CapContextAtSlidingWindow(config, /*enabled_by_default=*/false, out);
  };
  family.describe = DescribeLlama;
  return family;
}

}  // namespace lmserve::engine
