// Gemma 2 (Gemma2ForCausalLM) and Gemma 3's text model (Gemma3ForCausalLM).
//
// A pre-norm decoder with norms on both sides of attention and of the MLP ("sandwich" norms), a
// GELU-tanh gated MLP, embeddings scaled by sqrt(hidden), RMSNorm weights stored as scale - 1,
// tied embeddings, and local (sliding-window) layers beside global ones: alternating in Gemma 2,
// five local to one global in Gemma 3, or as `layer_types` says. Gemma 2 soft-caps its attention
// scores and final logits; Gemma 3 instead norms q and k per head, and rotates its local layers by
// their own embedding (`rope_local_base_freq`, unscaled).

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/strings.h"
#include "engine/model/checkpoint.h"
#include "engine/model/families/llama.h"
#include "engine/model/gguf.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine {
namespace {

class GemmaDescription final : public ModelDescription {
 public:
  GemmaDescription(const ModelConfig& c, bool qk_norm) : ModelDescription(c) {
    rotary_ = DecoderRotary(c);
    WeightPlan& w = weights_;
    const DecoderEnds ends = AddDecoderEnds(w, c);
    embed_ = ends.embed;
    final_norm_ = ends.final_norm;
    lm_head_ = ends.lm_head;
    layers_.resize(static_cast<size_t>(c.num_layers));
    for (int64_t l = 0; l < c.num_layers; ++l) {
      auto name = [l](std::string_view suffix) { return LayerTensorName(l, suffix); };
      Layer& layer = layers_[l];
      layer.attention = DecoderAttention(c, l);
      kv_windows_[static_cast<size_t>(l)] = layer.attention.window;
      layer.input_norm = AddNorm(w, c, "input_layernorm", l, name("input_layernorm.weight"));
      layer.qkv = AddQkv(w, c, l, /*fused=*/false, qk_norm, &layer.attention);
      layer.o_proj = AddOutputProjection(w, c, l);
      layer.post_attention_norm =
          AddNorm(w, c, "post_attention_layernorm", l, name("post_attention_layernorm.weight"));
      layer.pre_mlp_norm =
          AddNorm(w, c, "pre_feedforward_layernorm", l, name("pre_feedforward_layernorm.weight"));
      layer.post_mlp_norm =
          AddNorm(w, c, "post_feedforward_layernorm", l, name("post_feedforward_layernorm.weight"));
      layer.gate_up = AddGateUp(w, c, l, /*fused=*/false);
      layer.down = AddDown(w, c, l);
    }
  }

  absl::Status Forward(ForwardOps& ops) const override {
    const float eps = static_cast<float>(config_.rms_norm_eps);
    const float embed_scale =
        static_cast<float>(std::sqrt(static_cast<double>(config_.hidden_size)));
    LMSERVE_RETURN_IF_ERROR(ops.Embed(embed_, embed_scale));
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& layer = layers_[l];
      if (l == 0) {
        LMSERVE_RETURN_IF_ERROR(
            ops.RmsNorm(Buffer::kResidual, layer.input_norm, eps, Buffer::kNormed));
      } else {  // the previous layer's normed MLP output joins the residual stream
        LMSERVE_RETURN_IF_ERROR(ops.AddRmsNorm(Buffer::kResidual, Buffer::kProjected,
                                               layer.input_norm, eps, Buffer::kNormed));
      }
      LMSERVE_RETURN_IF_ERROR(ops.Linear(layer.qkv, Buffer::kNormed, Buffer::kQkv));
      LMSERVE_RETURN_IF_ERROR(ops.RotaryAndCacheWrite(layer.attention, Buffer::kQkv));
      LMSERVE_RETURN_IF_ERROR(ops.Attention(layer.attention, Buffer::kQkv, Buffer::kAttention));
      LMSERVE_RETURN_IF_ERROR(ops.Linear(layer.o_proj, Buffer::kAttention, Buffer::kProjected));
      LMSERVE_RETURN_IF_ERROR(
          ops.RmsNorm(Buffer::kProjected, layer.post_attention_norm, eps, Buffer::kProjected));
      LMSERVE_RETURN_IF_ERROR(ops.AddRmsNorm(Buffer::kResidual, Buffer::kProjected,
                                             layer.pre_mlp_norm, eps, Buffer::kNormed));
      LMSERVE_RETURN_IF_ERROR(ops.GatedLinear(layer.gate_up, Activation::kGeluTanh, Buffer::kNormed,
                                              Buffer::kActivation));
      LMSERVE_RETURN_IF_ERROR(ops.Linear(layer.down, Buffer::kActivation, Buffer::kProjected));
      LMSERVE_RETURN_IF_ERROR(
          ops.RmsNorm(Buffer::kProjected, layer.post_mlp_norm, eps, Buffer::kProjected));
    }
    LMSERVE_RETURN_IF_ERROR(ops.FinalNorm(Buffer::kResidual, Buffer::kProjected, final_norm_, eps));
    LMSERVE_RETURN_IF_ERROR(ops.LmHead(lm_head_, static_cast<float>(config_.final_logit_softcap)));
    return ops.Sample();
  }

 private:
  struct Layer {
    Weight input_norm, qkv, o_proj, post_attention_norm, pre_mlp_norm, gate_up, down, post_mlp_norm;
    AttentionLayer attention;
  };
  Weight embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
};

absl::Status ReadDouble(const nlohmann::json& config, const char* key, double* out) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) {
    return absl::InvalidArgumentError(StrCat("config.json: '", key, "' is not a number"));
  }
  *out = it->get<double>();
  return absl::OkStatus();
}

// The MLP activation: GELU's tanh approximation, as every Gemma checkpoint has it.
absl::Status RequireGeluTanh(const nlohmann::json& config) {
  for (const char* key : {"hidden_activation", "hidden_act"}) {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    if (!it->is_string()) {
      return absl::InvalidArgumentError(StrCat("config.json: '", key, "' is not a string"));
    }
    const std::string act = it->get<std::string>();
    if (act != "gelu_pytorch_tanh" && act != "gelu_tanh") {
      return absl::UnimplementedError(
          StrCat("config.json: ", key, " '", act, "' is not supported (only gelu_pytorch_tanh)"));
    }
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

// Every `pattern`-th layer global, the others local: Gemma's layer types when the file names none.
std::vector<bool> DefaultSlidingLayers(int64_t num_layers, int64_t pattern) {
  std::vector<bool> sliding(static_cast<size_t>(std::max<int64_t>(num_layers, 0)));
  for (size_t l = 0; l < sliding.size(); ++l) sliding[l] = (l + 1) % pattern != 0;
  return sliding;
}

// Gemma 3's local layers' rotary embedding: `theta`, unscaled, laid out as the global one.
RopeConfig LocalRope(const RopeConfig& global, double theta) {
  RopeConfig local;
  local.theta = theta;
  local.layout = global.layout;
  local.rotary_dim = global.rotary_dim;
  return local;
}

// Which layers are local: `layer_types`, else every `pattern`-th layer is global (Gemma 2: 2,
// Gemma 3: 6), as transformers fills layer_types in.
absl::Status ReadLayerTypes(const nlohmann::json& config, int64_t pattern, ModelConfig* out) {
  const size_t layers = static_cast<size_t>(std::max<int64_t>(out->num_layers, 0));
  if (auto it = config.find("sliding_window_pattern"); it != config.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 1) {
      return absl::InvalidArgumentError(
          "config.json: 'sliding_window_pattern' is not a positive integer");
    }
    pattern = it->get<int64_t>();
  }
  auto it = config.find("layer_types");
  if (it == config.end() || it->is_null()) {
    out->sliding_layers = DefaultSlidingLayers(out->num_layers, pattern);
    return absl::OkStatus();
  }
  out->sliding_layers.assign(layers, false);
  if (!it->is_array() || it->size() != layers) {
    return absl::InvalidArgumentError(
        StrCat("config.json: 'layer_types' is not a list of ", layers, " layer types"));
  }
  for (size_t l = 0; l < layers; ++l) {
    const nlohmann::json& type = (*it)[l];
    if (type == "sliding_attention") {
      out->sliding_layers[l] = true;
    } else if (type != "full_attention") {
      return absl::UnimplementedError(
          StrCat("config.json: layer_types[", l, "] ", type.dump(),
                 " is not supported (sliding_attention, full_attention)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadGemmaConfig(const nlohmann::json& config, int64_t pattern, ModelConfig* out) {
  LMSERVE_RETURN_IF_ERROR(RequireGeluTanh(config));
  LMSERVE_RETURN_IF_ERROR(RejectBiases(config));
  out->norm_weight_offset = 1.0;
  // Gemma's checkpoints tie the LM head unless they say otherwise.
  if (!config.contains("tie_word_embeddings")) out->tie_word_embeddings = true;
  LMSERVE_RETURN_IF_ERROR(ReadDouble(config, "query_pre_attn_scalar", &out->query_pre_attn_scalar));
  LMSERVE_RETURN_IF_ERROR(ReadDouble(config, "attn_logit_softcapping", &out->attn_logit_softcap));
  LMSERVE_RETURN_IF_ERROR(ReadDouble(config, "final_logit_softcapping", &out->final_logit_softcap));
  LMSERVE_RETURN_IF_ERROR(ReadSlidingWindow(config, /*enabled_by_default=*/true, out));
  return ReadLayerTypes(config, pattern, out);
}

absl::Status ReadGemma3Config(const nlohmann::json& config, ModelConfig* out) {
  LMSERVE_RETURN_IF_ERROR(ReadGemmaConfig(config, /*pattern=*/6, out));
  // Local layers: rope_local_base_freq, no scaling (the shared reader put rope_scaling, which
  // applies to the global layers only, into out->rope).
  double local_theta = 10000.0;
  LMSERVE_RETURN_IF_ERROR(ReadDouble(config, "rope_local_base_freq", &local_theta));
  RopeConfig local = LocalRope(out->rope, local_theta);
  // transformers 5 keeps both in rope_parameters, by layer type.
  if (auto it = config.find("rope_parameters"); it != config.end() && it->is_object()) {
    if (auto s = it->find("sliding_attention"); s != it->end() && s->is_object()) {
      LMSERVE_RETURN_IF_ERROR(ReadDouble(*s, "rope_theta", &local.theta));
    }
    if (auto f = it->find("full_attention"); f != it->end() && f->is_object()) {
      LMSERVE_ASSIGN_OR_RETURN(out->rope, ParseRopeParameters(*f, out->rope));
    }
  }
  out->local_rope = local;
  return absl::OkStatus();
}

// GGUF (llama.cpp's gemma2 / gemma3): norms stored as the scale itself; sandwich norm names of
// their own.
const std::vector<std::pair<std::string, std::string>>& GemmaGgufNames() {
  static const auto* names = new std::vector<std::pair<std::string, std::string>>{
      {"post_attention_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_norm.weight", "pre_feedforward_layernorm.weight"},
      {"post_ffw_norm.weight", "post_feedforward_layernorm.weight"},
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
  };
  return *names;
}

absl::Status ReadGemmaGguf(const GgufFile& file, int64_t pattern, ModelConfig* out) {
  const std::string arch = file.GetString("general.architecture").value_or("");
  out->tie_word_embeddings = true;
  auto read_float = [&](const char* suffix, double* value) -> absl::Status {
    const GgufValue* v = file.Find(StrCat(arch, ".", suffix));
    if (v == nullptr) return absl::OkStatus();
    if (!v->AsFloat().has_value()) {
      return absl::InvalidArgumentError(
          StrCat(file.path(), ": metadata key '", arch, ".", suffix, "' is not a number"));
    }
    *value = *v->AsFloat();
    return absl::OkStatus();
  };
  LMSERVE_RETURN_IF_ERROR(read_float("attn_logit_softcapping", &out->attn_logit_softcap));
  LMSERVE_RETURN_IF_ERROR(read_float("final_logit_softcapping", &out->final_logit_softcap));
  // Not a llama.cpp key: lmserve writes it so that a round trip keeps the query scale. Without
  // it, llama.cpp's rule: hidden / heads for Gemma 2 27B, head_dim otherwise.
  LMSERVE_RETURN_IF_ERROR(
      read_float("attention.query_pre_attn_scalar", &out->query_pre_attn_scalar));
  if (out->query_pre_attn_scalar == 0 && arch == "gemma2" && out->hidden_size == 4608 &&
      out->num_attention_heads == 32) {
    out->query_pre_attn_scalar = 144;
  }
  if (out->sliding_window == 0) {
    return absl::InvalidArgumentError(
        StrCat(file.path(), ": metadata key '", arch, ".attention.sliding_window' is missing"));
  }
  out->sliding_layers = DefaultSlidingLayers(out->num_layers, pattern);
  if (const std::optional<std::vector<bool>> layers =
          file.GetBoolArray(StrCat(arch, ".attention.sliding_window_pattern"));
      layers.has_value()) {
    if (static_cast<int64_t>(layers->size()) != out->num_layers) {
      return absl::InvalidArgumentError(
          StrCat(file.path(), ": ", arch, ".attention.sliding_window_pattern has ", layers->size(),
                 " entries for ", out->num_layers, " layers"));
    }
    out->sliding_layers = *layers;
  }
  if (arch == "gemma3") {
    // llama.cpp: local layers rotate with base 10000, unscaled.
    double local_theta = 10000.0;
    LMSERVE_RETURN_IF_ERROR(read_float("rope.freq_base_swa", &local_theta));
    out->local_rope = LocalRope(out->rope, local_theta);
  }
  return absl::OkStatus();
}

ModelFamily GemmaFamily(std::string name, std::string architecture, std::string model_type,
                        int64_t pattern, bool qk_norm) {
  ModelFamily family;
  family.name = name;
  family.hf_architectures = {std::move(architecture)};
  family.hf_model_types = {std::move(model_type)};
  family.gguf_architecture = name;
  family.gguf_rope_layout = RopeLayout::kHalfSplit;
  family.gguf_layer_names = GemmaGgufNames();
  family.read_hf_config = [pattern, qk_norm](const nlohmann::json& config, ModelConfig* out) {
    return qk_norm ? ReadGemma3Config(config, out) : ReadGemmaConfig(config, pattern, out);
  };
  family.read_gguf_config = [pattern](const GgufFile& file, ModelConfig* out) {
    return ReadGemmaGguf(file, pattern, out);
  };
  family.describe = [qk_norm](const ModelConfig& config) -> std::unique_ptr<ModelDescription> {
    return std::make_unique<GemmaDescription>(config, qk_norm);
  };
  return family;
}

}  // namespace

ModelFamily Gemma2Family() {
  return GemmaFamily("gemma2", "Gemma2ForCausalLM", "gemma2", /*pattern=*/2, /*qk_norm=*/false);
}

ModelFamily Gemma3Family() {
  return GemmaFamily("gemma3", "Gemma3ForCausalLM", "gemma3_text", /*pattern=*/6,
                     /*qk_norm=*/true);
}

}  // namespace lmserve::engine
