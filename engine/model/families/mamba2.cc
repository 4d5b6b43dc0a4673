#include "engine/model/families/mamba2.h"

#include <cmath>
#include <limits>
#include <vector>

#include "common/status.h"
#include "common/strings.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine {
namespace {

std::string LayerName(int64_t layer, std::string_view suffix) {
  return StrCat("backbone.layers.", layer, ".", suffix);
}

class Mamba2Description final : public ModelDescription {
 public:
  explicit Mamba2Description(const ModelConfig& c) : ModelDescription(c) {
    kv_windows_.clear();  // no attention: no KV cache layers
    WeightPlan& w = weights_;
    embed_ = w.AddTensor("embed_tokens", -1, "backbone.embeddings.weight", c.vocab_size,
                         c.hidden_size);
    final_norm_ = w.AddTensor("norm", -1, "backbone.norm_f.weight", c.hidden_size);
    lm_head_ = c.tie_word_embeddings
                   ? w.AddTied("lm_head", embed_)
                   : w.AddTensor("lm_head", -1, "lm_head.weight", c.vocab_size, c.hidden_size);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      Layer layer;
      layer.norm = w.AddTensor("input_layernorm", l, LayerName(l, "norm.weight"), c.hidden_size);
      layer.mixer = DeclareSsmMixer(w, c, l, l, LayerName(l, "mixer."));
      layers_.push_back(layer);
    }
  }

  absl::Status Forward(ForwardOps& ops) const override {
    const float eps = static_cast<float>(config_.rms_norm_eps);
    LMSERVE_RETURN_IF_ERROR(ops.Embed(embed_, 1.0f));
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& layer = layers_[l];
      if (l == 0) {
        LMSERVE_RETURN_IF_ERROR(ops.RmsNorm(Buffer::kResidual, layer.norm, eps, Buffer::kNormed));
      } else {  // the previous mixer's output joins the residual stream
        LMSERVE_RETURN_IF_ERROR(ops.AddRmsNorm(Buffer::kResidual, Buffer::kProjected, layer.norm,
                                               eps, Buffer::kNormed));
      }
      LMSERVE_RETURN_IF_ERROR(ForwardSsmMixer(ops, layer.mixer, Buffer::kNormed,
                                              Buffer::kProjected));
    }
    LMSERVE_RETURN_IF_ERROR(
        ops.FinalNorm(Buffer::kResidual, Buffer::kProjected, final_norm_, eps));
    LMSERVE_RETURN_IF_ERROR(ops.LmHead(lm_head_, 0.0f));
    return ops.Sample();
  }

 private:
  struct Layer {
    Weight norm;  // [hidden]
    SsmMixer mixer;
  };
  Weight embed_;       // [vocab, hidden]
  Weight final_norm_;  // [hidden]
  Weight lm_head_;     // [vocab, hidden]: its own, or the embeddings when tied
  std::vector<Layer> layers_;
};

absl::Status ReadInt(const nlohmann::json& config, const char* key, int64_t* out) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(StrCat("config.json: '", key, "' is not an integer"));
  }
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status ReadBool(const nlohmann::json& config, const char* key, bool* out) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(StrCat("config.json: '", key, "' is not a boolean"));
  }
  *out = it->get<bool>();
  return absl::OkStatus();
}

absl::Status ReadMamba2HfConfig(const nlohmann::json& config, ModelConfig* out) {
  // No attention: the shared reader's attention fields (Mamba's head_dim among them) do not
  // apply.
  out->num_attention_heads = out->num_kv_heads = out->head_dim = out->intermediate_size = 0;
  SsmConfig& s = out->ssm;
  s.num_heads = 128;  // Mamba2Config's defaults
  s.head_dim = 64;
  s.state_size = 128;
  s.n_groups = 8;
  s.conv_kernel = 4;
  s.chunk_size = 256;
  LMSERVE_RETURN_IF_ERROR(ReadInt(config, "num_heads", &s.num_heads));
  LMSERVE_RETURN_IF_ERROR(ReadInt(config, "head_dim", &s.head_dim));
  LMSERVE_RETURN_IF_ERROR(ReadInt(config, "state_size", &s.state_size));
  LMSERVE_RETURN_IF_ERROR(ReadInt(config, "n_groups", &s.n_groups));
  LMSERVE_RETURN_IF_ERROR(ReadInt(config, "conv_kernel", &s.conv_kernel));
  LMSERVE_RETURN_IF_ERROR(ReadInt(config, "chunk_size", &s.chunk_size));
  LMSERVE_RETURN_IF_ERROR(ReadBool(config, "use_conv_bias", &s.conv_bias));
  // transformers' MambaRMSNormGated normalizes the whole inner width (mamba_ssm's kernels, and
  // llama.cpp, per group): the fixtures are transformers' numbers.
  s.norm_groups = 1;
  double expand = 2;
  if (auto it = config.find("expand"); it != config.end() && !it->is_null()) {
    if (!it->is_number()) return absl::InvalidArgumentError("config.json: 'expand' is not a number");
    expand = it->get<double>();
  }
  if (static_cast<double>(s.num_heads * s.head_dim) != expand * static_cast<double>(out->hidden_size)) {
    return absl::InvalidArgumentError(
        StrCat("config.json: num_heads (", s.num_heads, ") x head_dim (", s.head_dim,
               ") is not expand (", expand, ") x hidden_size (", out->hidden_size, ")"));
  }
  out->rms_norm_eps = 1e-5;  // Mamba2Config's layer_norm_epsilon, which every norm uses
  if (auto it = config.find("layer_norm_epsilon"); it != config.end() && !it->is_null()) {
    if (!it->is_number()) {
      return absl::InvalidArgumentError("config.json: 'layer_norm_epsilon' is not a number");
    }
    out->rms_norm_eps = it->get<double>();
  }
  bool use_bias = false, rms_norm = true;
  LMSERVE_RETURN_IF_ERROR(ReadBool(config, "use_bias", &use_bias));
  LMSERVE_RETURN_IF_ERROR(ReadBool(config, "rms_norm", &rms_norm));
  if (use_bias || !rms_norm) {
    return absl::UnimplementedError(
        "config.json: Mamba-2 with use_bias or without rms_norm is not supported");
  }
  if (auto it = config.find("hidden_act"); it != config.end() && it->is_string() &&
                                           it->get<std::string>() != "silu") {
    return absl::UnimplementedError(StrCat("config.json: hidden_act '", it->get<std::string>(),
                                           "' is not supported (only silu)"));
  }
  // [min, max]; Python writes an infinite max as Infinity, which the reader takes as null.
  if (auto it = config.find("time_step_limit"); it != config.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != 2 || !(*it)[0].is_number() ||
        !((*it)[1].is_number() || (*it)[1].is_null())) {
      return absl::InvalidArgumentError("config.json: 'time_step_limit' is not a pair of numbers");
    }
    s.time_step_min = (*it)[0].get<double>();
    const double max = (*it)[1].is_null() ? 0.0 : (*it)[1].get<double>();
    s.time_step_max = std::isinf(max) ? 0.0 : max;
  }
  // Mamba2Config has no context length: a state-space model has none of its own.
  if (out->max_position_embeddings <= 0) out->max_position_embeddings = int64_t{1} << 16;
  return absl::OkStatus();
}

}  // namespace

SsmMixer DeclareSsmMixer(WeightPlan& w, const ModelConfig& c, int64_t l, int64_t state_layer,
                         const std::string& prefix) {
  const SsmConfig& s = c.ssm;
  SsmMixer mixer;
  mixer.in_proj =
      w.AddTensor("ssm_in_proj", l, prefix + "in_proj.weight", s.in_proj_dim(), c.hidden_size);
  WeightPart conv{prefix + "conv1d.weight", s.conv_dim()};
  conv.checkpoint_shape = {s.conv_dim(), 1, s.conv_kernel};
  mixer.ssm.conv_weight = w.Add("ssm_conv1d", l, s.conv_dim(), s.conv_kernel, {conv});
  if (s.conv_bias) {
    mixer.ssm.conv_bias = w.AddTensor("ssm_conv1d_bias", l, prefix + "conv1d.bias", s.conv_dim());
  }
  mixer.ssm.dt_bias = w.AddTensor("ssm_dt_bias", l, prefix + "dt_bias", s.num_heads);
  mixer.ssm.a_log = w.AddTensor("ssm_a_log", l, prefix + "A_log", s.num_heads);
  mixer.ssm.d = w.AddTensor("ssm_d", l, prefix + "D", s.num_heads);
  mixer.ssm.norm = w.AddTensor("ssm_norm", l, prefix + "norm.weight", s.inner());
  mixer.out_proj =
      w.AddTensor("ssm_out_proj", l, prefix + "out_proj.weight", c.hidden_size, s.inner());
  mixer.ssm.state_layer = state_layer;
  mixer.ssm.norm_epsilon = static_cast<float>(c.rms_norm_eps);
  return mixer;
}

absl::Status ForwardSsmMixer(ForwardOps& ops, const SsmMixer& mixer, Buffer in, Buffer out) {
  LMSERVE_RETURN_IF_ERROR(ops.Linear(mixer.in_proj, in, Buffer::kSsmIn));
  LMSERVE_RETURN_IF_ERROR(ops.SsmConv(mixer.ssm, Buffer::kSsmIn, Buffer::kSsmConv));
  LMSERVE_RETURN_IF_ERROR(
      ops.SsmScan(mixer.ssm, Buffer::kSsmIn, Buffer::kSsmConv, Buffer::kSsmOut));
  LMSERVE_RETURN_IF_ERROR(
      ops.GatedRmsNorm(mixer.ssm, Buffer::kSsmIn, Buffer::kSsmOut, Buffer::kSsmOut));
  return ops.Linear(mixer.out_proj, Buffer::kSsmOut, out);
}

ModelFamily Mamba2Family() {
  ModelFamily family;
  family.name = "mamba2";
  family.hf_architectures = {"Mamba2ForCausalLM"};
  family.hf_model_types = {"mamba2"};
  // GGUF (llama.cpp's mamba2) is not read yet: its files store A = -exp(A_log) and a grouped norm.
  family.read_hf_config = ReadMamba2HfConfig;
  family.describe = [](const ModelConfig& config) -> std::unique_ptr<ModelDescription> {
    return std::make_unique<Mamba2Description>(config);
  };
  return family;
}

}  // namespace lmserve::engine
