#include "engine/model/families/llama.h"

#include <cmath>
#include <limits>

#include "common/status.h"
#include "common/strings.h"
#include "engine/model/checkpoint.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine {

std::vector<RopeConfig> DecoderRotary(const ModelConfig& c) {
  std::vector<RopeConfig> rotary = {RopeForContext(c.rope, c.max_position_embeddings)};
  if (c.local_rope.has_value()) {
    rotary.push_back(RopeForContext(*c.local_rope, c.max_position_embeddings));
  }
  return rotary;
}

AttentionLayer DecoderAttention(const ModelConfig& c, int64_t layer) {
  AttentionLayer attention;
  attention.layer = layer;
  const bool sliding =
      c.sliding_window > 0 && (c.sliding_layers.empty() || c.sliding_layers[layer]);
  attention.window = sliding ? c.sliding_window : 0;
  attention.rope = sliding && c.local_rope.has_value() ? 1 : 0;
  const double scalar =
      c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : static_cast<double>(c.head_dim);
  attention.scale = static_cast<float>(1.0 / std::sqrt(scalar));
  attention.softcap = static_cast<float>(c.attn_logit_softcap);
  attention.norm_epsilon = static_cast<float>(c.rms_norm_eps);
  return attention;
}

DecoderEnds AddDecoderEnds(WeightPlan& w, const ModelConfig& c) {
  DecoderEnds ends;
  const int64_t vocab_rows = VocabShardRows(c);
  ends.embed =
      w.AddTensor("embed_tokens", -1, "model.embed_tokens.weight", vocab_rows, c.hidden_size);
  w.SetSplit(ends.embed, Split::kVocab, c);
  ends.final_norm = AddNorm(w, c, "norm", -1, "model.norm.weight");
  if (c.tie_word_embeddings) {
    ends.lm_head = w.AddTied("lm_head", ends.embed);
  } else {
    ends.lm_head = w.AddTensor("lm_head", -1, "lm_head.weight", vocab_rows, c.hidden_size);
    w.SetSplit(ends.lm_head, Split::kVocab, c);
  }
  return ends;
}

Weight AddGateUp(WeightPlan& w, const ModelConfig& c, int64_t l, bool fused) {
  auto name = [l](std::string_view suffix) { return LayerTensorName(l, suffix); };
  const int64_t inter = c.intermediate_size;
  const Weight gate_up =
      fused ? w.Add("gate_up", l, 2 * inter, c.hidden_size,
                    {{name("mlp.gate_up_proj.weight"), 2 * inter, {RowSlices(inter), RowSlices(inter)}}})
            : w.Add("gate_up", l, 2 * inter, c.hidden_size,
                    {{name("mlp.gate_proj.weight"), inter}, {name("mlp.up_proj.weight"), inter}});
  w.SetSplit(gate_up, Split::kRows, c);
  return gate_up;
}

Weight AddDown(WeightPlan& w, const ModelConfig& c, int64_t l) {
  const Weight down = w.AddTensor("down_proj", l, LayerTensorName(l, "mlp.down_proj.weight"),
                                  c.hidden_size, c.intermediate_size);
  w.SetSplit(down, Split::kCols, c);
  return down;
}

Weight AddOutputProjection(WeightPlan& w, const ModelConfig& c, int64_t l) {
  const Weight o_proj = w.AddTensor("o_proj", l, LayerTensorName(l, "self_attn.o_proj.weight"),
                                    c.hidden_size, c.num_attention_heads * c.head_dim);
  w.SetSplit(o_proj, Split::kCols, c);
  return o_proj;
}

Weight AddNorm(WeightPlan& plan, const ModelConfig& c, std::string kind, int64_t layer,
               std::string name) {
  const Weight weight = plan.AddTensor(std::move(kind), layer, std::move(name), c.hidden_size);
  plan.SetOffset(weight, static_cast<float>(c.norm_weight_offset));
  return weight;
}

RowSlices KvRows(const ModelConfig& c) {
  return RowSlices(c.num_kv_heads * c.head_dim, c.tensor_parallel_kv_slices);
}

std::vector<WeightPart> QkvParts(const ModelConfig& c, int64_t l, std::string_view suffix) {
  auto name = [l, suffix](std::string_view projection) {
    return LayerTensorName(l, StrCat("self_attn.", projection, ".", suffix));
  };
  const int64_t q_dim = c.num_attention_heads * c.head_dim, kv_dim = c.num_kv_heads * c.head_dim;
  return {{name("q_proj"), q_dim},
          {name("k_proj"), kv_dim, {KvRows(c)}},
          {name("v_proj"), kv_dim, {KvRows(c)}}};
}

Weight AddQkv(WeightPlan& w, const ModelConfig& c, int64_t l, bool fused, bool qk_norm,
              AttentionLayer* attention) {
  auto name = [l](std::string_view suffix) { return LayerTensorName(l, suffix); };
  const int64_t q_dim = c.num_attention_heads * c.head_dim, kv_dim = c.num_kv_heads * c.head_dim;
  const Weight qkv = w.Add("qkv", l, q_dim + 2 * kv_dim, c.hidden_size,
                           fused ? std::vector<WeightPart>{{name("self_attn.qkv_proj.weight"),
                                                            q_dim + 2 * kv_dim,
                                                            {RowSlices(q_dim), KvRows(c), KvRows(c)}}}
                                 : QkvParts(c, l, "weight"));
  w.SetSplit(qkv, Split::kRows, c);
  if (qk_norm) {
    const float offset = static_cast<float>(c.norm_weight_offset);
    attention->q_norm = w.AddTensor("q_norm", l, name("self_attn.q_norm.weight"), c.head_dim);
    attention->k_norm = w.AddTensor("k_norm", l, name("self_attn.k_norm.weight"), c.head_dim);
    w.SetOffset(attention->q_norm, offset);
    w.SetOffset(attention->k_norm, offset);
  }
  return qkv;
}

MoeLayer DeclareMoeLayer(WeightPlan& w, const ModelConfig& c, int64_t l,
                         const MoeTensorNames& names) {
  const int64_t hidden = c.hidden_size, inter = c.moe_intermediate_size;
  MoeLayer moe;
  moe.num_experts = static_cast<int32_t>(c.num_experts);
  moe.top_k = static_cast<int32_t>(c.num_experts_per_tok);
  moe.intermediate = inter;
  moe.normalize_top_k = c.norm_topk_prob;
  moe.act = Activation::kSilu;
  moe.router =
      w.AddTensor("moe_router", l, LayerTensorName(l, names.router), c.num_experts, hidden);
  std::vector<WeightPart> gate_up, down;
  for (int64_t e = 0; e < c.num_experts; ++e) {
    gate_up.push_back({names.Expert(l, e, names.gate), inter});
    gate_up.push_back({names.Expert(l, e, names.up), inter});
    down.push_back({names.Expert(l, e, names.down), hidden});
  }
  moe.gate_up = w.Add("moe_gate_up", l, c.num_experts * 2 * inter, hidden, std::move(gate_up));
  moe.down = w.Add("moe_down", l, c.num_experts * hidden, inter, std::move(down));
  w.SetSplit(moe.gate_up, Split::kRows, c);  // every expert's gate and up rows
  w.SetSplit(moe.down, Split::kCols, c);
  return moe;
}

absl::Status ReadHfMoeConfig(const nlohmann::json& config, const char* num_experts_key,
                             bool default_norm_topk_prob, ModelConfig* out) {
  auto read_int = [&](const char* key, int64_t* value) -> absl::Status {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_number_integer()) {
      return absl::InvalidArgumentError(StrCat("config.json: '", key, "' is not an integer"));
    }
    *value = it->get<int64_t>();
    return absl::OkStatus();
  };
  LMSERVE_RETURN_IF_ERROR(read_int(num_experts_key, &out->num_experts));
  LMSERVE_RETURN_IF_ERROR(read_int("num_experts_per_tok", &out->num_experts_per_tok));
  out->moe_intermediate_size = out->intermediate_size;
  LMSERVE_RETURN_IF_ERROR(read_int("moe_intermediate_size", &out->moe_intermediate_size));
  LMSERVE_RETURN_IF_ERROR(read_int("decoder_sparse_step", &out->decoder_sparse_step));
  out->norm_topk_prob = default_norm_topk_prob;
  if (auto it = config.find("norm_topk_prob"); it != config.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      return absl::InvalidArgumentError("config.json: 'norm_topk_prob' is not a boolean");
    }
    out->norm_topk_prob = it->get<bool>();
  }
  out->mlp_only_layers.clear();
  if (auto it = config.find("mlp_only_layers"); it != config.end() && !it->is_null()) {
    if (!it->is_array()) {
      return absl::InvalidArgumentError("config.json: 'mlp_only_layers' is not a list");
    }
    for (const nlohmann::json& layer : *it) {
      if (!layer.is_number_integer()) {
        return absl::InvalidArgumentError("config.json: 'mlp_only_layers' holds a non-integer");
      }
      out->mlp_only_layers.push_back(layer.get<int64_t>());
    }
  }
  if (out->num_experts <= 0) {
    return absl::InvalidArgumentError(
        StrCat("config.json: '", num_experts_key, "' must be a positive number of experts"));
  }
  return absl::OkStatus();
}

LlamaDescription::LlamaDescription(const ModelConfig& c, const LlamaOptions& options)
    : ModelDescription(c) {
  rotary_ = DecoderRotary(c);
  const int64_t q_dim = c.num_attention_heads * c.head_dim, kv_dim = c.num_kv_heads * c.head_dim;
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
    layer.qkv = AddQkv(w, c, l, options.fused_qkv, options.qk_norm, &layer.attention);
    if (c.attention_bias) {
      layer.attention.qkv_bias =
          w.Add("qkv_bias", l, q_dim + 2 * kv_dim, 0, QkvParts(c, l, "bias"));
      w.SetSplit(layer.attention.qkv_bias, Split::kRows, c);
    }
    layer.o_proj = AddOutputProjection(w, c, l);
    layer.post_norm =
        AddNorm(w, c, "post_attention_layernorm", l, name("post_attention_layernorm.weight"));
    if (options.moe_names.has_value() && IsMoeLayer(c, l)) {
      layer.moe = DeclareMoeLayer(w, c, l, *options.moe_names);
      continue;
    }
    layer.gate_up = AddGateUp(w, c, l, options.fused_gate_up);
    layer.down = AddDown(w, c, l);
  }
}

absl::Status LlamaDescription::Forward(ForwardOps& ops) const {
  const float eps = static_cast<float>(config_.rms_norm_eps);
  LMSERVE_RETURN_IF_ERROR(ops.Embed(embed_, 1.0f));
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
    if (layer.moe.has_value()) {
      LMSERVE_RETURN_IF_ERROR(ops.Moe(*layer.moe, Buffer::kNormed, Buffer::kProjected));
      continue;
    }
    LMSERVE_RETURN_IF_ERROR(
        ops.GatedLinear(layer.gate_up, Activation::kSilu, Buffer::kNormed, Buffer::kActivation));
    LMSERVE_RETURN_IF_ERROR(ops.Linear(layer.down, Buffer::kActivation, Buffer::kProjected));
  }
  LMSERVE_RETURN_IF_ERROR(ops.FinalNorm(Buffer::kResidual, Buffer::kProjected, final_norm_, eps));
  LMSERVE_RETURN_IF_ERROR(ops.LmHead(lm_head_, 0.0f));
  return ops.Sample();
}

absl::Status ReadSlidingWindow(const nlohmann::json& config, bool enabled_by_default,
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
    if (!it->is_number_integer() || it->get<int64_t>() < 0 ||
        it->get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          "config.json: 'sliding_window' is not a non-negative 32-bit integer");
    }
    window = it->get<int64_t>();
  }
  // A window as long as the context changes nothing.
  out->sliding_window =
      enabled && window < out->max_position_embeddings ? static_cast<int32_t>(window) : 0;
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
    return ReadSlidingWindow(config, /*enabled_by_default=*/false, out);
  };
  family.describe = DescribeLlama;
  return family;
}

}  // namespace lmserve::engine
