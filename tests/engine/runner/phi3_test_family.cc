// A model family written outside engine/: Phi-3 (Phi3ForCausalLM) as far as it needs no new op,
// which is the fixture hf-families/phi3-fused (no partial rotary, no longrope, no sliding window).
//
// This file is the whole family: its names, its config checks, its tensors (Phi-3's checkpoints
// hold q/k/v already fused as `qkv_proj`, and gate/up as `gate_up_proj`) and its layer order over
// ForwardOps. No runner knows it: the CPU runner's tests (family_variant_test.cc) and the CUDA
// runner's (runner_gpu/family_variant_gpu_test.cc) compile this file in and load the fixture. It
// registers itself when the test binary starts.

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/strings.h"
#include "engine/model/checkpoint.h"
#include "engine/model/family.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine {
namespace {

class Phi3Description final : public ModelDescription {
 public:
  explicit Phi3Description(const ModelConfig& c) : ModelDescription(c) {
    rotary_ = {c.rope};
    const int64_t hidden = c.hidden_size, inter = c.intermediate_size;
    const int64_t qkv_rows = (c.num_attention_heads + 2 * c.num_kv_heads) * c.head_dim;
    const int64_t q_dim = c.num_attention_heads * c.head_dim;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
    WeightPlan& w = weights_;
    embed_ = w.AddTensor("embed_tokens", -1, "model.embed_tokens.weight", c.vocab_size, hidden);
    final_norm_ = w.AddTensor("norm", -1, "model.norm.weight", hidden);
    lm_head_ = c.tie_word_embeddings
                   ? w.AddTied("lm_head", embed_)
                   : w.AddTensor("lm_head", -1, "lm_head.weight", c.vocab_size, hidden);
    for (int64_t l = 0; l < c.num_layers; ++l) {
      auto name = [l](std::string_view suffix) { return LayerTensorName(l, suffix); };
      Layer& layer = layers_.emplace_back();
      layer.input_norm = w.AddTensor("input_layernorm", l, name("input_layernorm.weight"), hidden);
      layer.qkv = w.AddTensor("qkv", l, name("self_attn.qkv_proj.weight"), qkv_rows, hidden);
      layer.attention.layer = l;
      layer.attention.scale = scale;
      layer.o_proj = w.AddTensor("o_proj", l, name("self_attn.o_proj.weight"), hidden, q_dim);
      layer.post_norm = w.AddTensor("post_attention_layernorm", l,
                                    name("post_attention_layernorm.weight"), hidden);
      layer.gate_up = w.AddTensor("gate_up", l, name("mlp.gate_up_proj.weight"), 2 * inter, hidden);
      layer.down = w.AddTensor("down_proj", l, name("mlp.down_proj.weight"), hidden, inter);
    }
  }

  absl::Status Forward(ForwardOps& ops) const override {
    const float eps = static_cast<float>(config_.rms_norm_eps);
    LMSERVE_RETURN_IF_ERROR(ops.Embed(embed_));
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& layer = layers_[l];
      if (l == 0) {
        LMSERVE_RETURN_IF_ERROR(
            ops.RmsNorm(Buffer::kResidual, layer.input_norm, eps, Buffer::kNormed));
      } else {
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

 private:
  struct Layer {
    Weight input_norm, qkv, o_proj, post_norm, gate_up, down;
    AttentionLayer attention;
  };
  Weight embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
};

// What this description does not cover is refused, never approximated.
absl::Status ReadPhi3Config(const nlohmann::json& config, ModelConfig* out) {
  if (config.value("hidden_act", std::string("silu")) != "silu") {
    return absl::UnimplementedError("config.json: phi3 test family: hidden_act must be silu");
  }
  for (const char* key : {"rope_scaling", "sliding_window"}) {
    if (auto it = config.find(key); it != config.end() && !it->is_null()) {
      return absl::UnimplementedError(StrCat("config.json: phi3 test family: no ", key));
    }
  }
  if (auto it = config.find("partial_rotary_factor");
      it != config.end() && !it->is_null() && it->get<double>() != 1.0) {
    return absl::UnimplementedError("config.json: phi3 test family: no partial rotary");
  }
  return absl::OkStatus();
}

[[maybe_unused]] const bool kRegistered = [] {
  ModelFamily family;
  family.name = "phi3";
  family.hf_architectures = {"Phi3ForCausalLM"};
  family.hf_model_types = {"phi3"};
  family.read_hf_config = ReadPhi3Config;
  family.describe = [](const ModelConfig& config) {
    return std::make_unique<Phi3Description>(config);
  };
  RegisterModelFamily(std::move(family));
  return true;
}();

}  // namespace
}  // namespace lmserve::engine
