#include "engine/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <tuple>

#include "common/status.h"
#include "common/strings.h"
#include "engine/model/family.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine {
namespace {

using nlohmann::json;

// Reads an optional integer; errors name the key when it has another type.
absl::Status ReadInt(const json& object, const char* key, int64_t* out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number_integer()) {
    return absl::InvalidArgumentError(StrCat("config.json: '", key, "' is not an integer"));
  }
  *out = it->get<int64_t>();
  return absl::OkStatus();
}

absl::Status ReadDouble(const json& object, const char* key, double* out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_number()) {
    return absl::InvalidArgumentError(StrCat("config.json: '", key, "' is not a number"));
  }
  *out = it->get<double>();
  return absl::OkStatus();
}

absl::Status ReadString(const json& object, const char* key, std::string* out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) {
    return absl::InvalidArgumentError(StrCat("config.json: '", key, "' is not a string"));
  }
  *out = it->get<std::string>();
  return absl::OkStatus();
}

absl::Status ReadBool(const json& object, const char* key, bool* out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(StrCat("config.json: '", key, "' is not a boolean"));
  }
  *out = it->get<bool>();
  return absl::OkStatus();
}

absl::Status ReadFloats(const json& object, const char* key, std::vector<float>* out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return absl::OkStatus();
  out->clear();
  if (it->is_array()) {
    for (const json& v : *it) {
      if (!v.is_number()) break;
      out->push_back(v.get<float>());
    }
    if (out->size() == it->size()) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(StrCat("config.json: '", key, "' is not a list of numbers"));
}

// eos_token_id is an integer or a list of integers.
absl::Status ReadTokenIds(const json& object, const char* key, std::vector<int32_t>* out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return absl::OkStatus();
  out->clear();
  if (it->is_number_integer()) {
    out->push_back(it->get<int32_t>());
    return absl::OkStatus();
  }
  if (it->is_array()) {
    for (const json& id : *it) {
      if (!id.is_number_integer()) break;
      out->push_back(id.get<int32_t>());
    }
    if (out->size() == it->size()) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      StrCat("config: '", key, "' is neither an integer nor a list of integers"));
}

absl::Status ParseRopeScaling(const json& scaling, RopeConfig* rope) {
  std::string type = "default";
  if (auto it = scaling.find("rope_type"); it != scaling.end() && it->is_string()) {
    type = it->get<std::string>();
  } else if (auto it2 = scaling.find("type"); it2 != scaling.end() && it2->is_string()) {
    type = it2->get<std::string>();
  }
  // transformers 5 moves rope_theta into this object (rope_parameters).
  LMSERVE_RETURN_IF_ERROR(ReadDouble(scaling, "rope_theta", &rope->theta));
  if (type == "default") {
    rope->scaling = RopeScaling::kDefault;
    return absl::OkStatus();
  }
  LMSERVE_RETURN_IF_ERROR(ReadDouble(scaling, "factor", &rope->factor));
  if (type == "longrope") {
    rope->scaling = RopeScaling::kLongRope;
    LMSERVE_RETURN_IF_ERROR(ReadFloats(scaling, "short_factor", &rope->short_factors));
    LMSERVE_RETURN_IF_ERROR(ReadFloats(scaling, "long_factor", &rope->long_factors));
    LMSERVE_RETURN_IF_ERROR(ReadInt(scaling, "original_max_position_embeddings",
                                    &rope->original_max_position_embeddings));
    rope->attention_factor = 0;  // derived once the context is known, unless given
    LMSERVE_RETURN_IF_ERROR(ReadDouble(scaling, "attention_factor", &rope->attention_factor));
    return absl::OkStatus();
  }
  if (type == "linear") {
    rope->scaling = RopeScaling::kLinear;
  } else if (type == "llama3") {
    rope->scaling = RopeScaling::kLlama3;
    LMSERVE_RETURN_IF_ERROR(ReadDouble(scaling, "low_freq_factor", &rope->low_freq_factor));
    LMSERVE_RETURN_IF_ERROR(ReadDouble(scaling, "high_freq_factor", &rope->high_freq_factor));
    LMSERVE_RETURN_IF_ERROR(ReadInt(scaling, "original_max_position_embeddings",
                                    &rope->original_max_position_embeddings));
  } else {
    return absl::UnimplementedError(
        StrCat("config.json: rope scaling type '", type,
               "' is not supported (supported: default, linear, llama3, longrope)"));
  }
  if (!(rope->factor > 0)) {
    return absl::InvalidArgumentError("config.json: rope scaling factor must be positive");
  }
  return absl::OkStatus();
}

absl::Status ValidateRope(const RopeConfig& rope, const ModelConfig& c, const char* what) {
  auto invalid = [&](auto&&... message) {
    return absl::InvalidArgumentError(StrCat("model config: ", what, ": ", message...));
  };
  if (!(rope.theta > 0)) return invalid("rope_theta must be positive");
  const int64_t rotary_dim = RotaryDim(rope, c.head_dim);
  if (rotary_dim <= 0 || rotary_dim > c.head_dim || rotary_dim % 2 != 0) {
    return invalid("the rotary dims (", rotary_dim, ") must be even and in (0, head_dim ",
                   c.head_dim, "]");
  }
  if (rope.scaling == RopeScaling::kLlama3 &&
      (!(rope.high_freq_factor > rope.low_freq_factor) || !(rope.low_freq_factor > 0) ||
       rope.original_max_position_embeddings <= 0)) {
    return invalid(
        "llama3 rope scaling needs high_freq_factor > low_freq_factor > 0 and a positive "
        "original_max_position_embeddings");
  }
  const size_t pairs = static_cast<size_t>(rotary_dim / 2);
  if (rope.scaling == RopeScaling::kLongRope &&
      (rope.short_factors.size() != pairs || rope.long_factors.size() != pairs ||
       rope.original_max_position_embeddings <= 0)) {
    return invalid("longrope needs ", pairs, " short and long factors (rotary dims / 2; got ",
                   rope.short_factors.size(), " and ", rope.long_factors.size(),
                   ") and a positive original_max_position_embeddings");
  }
  if (!rope.freq_factors.empty() && rope.freq_factors.size() != pairs) {
    return invalid(rope.freq_factors.size(), " rope frequency factors for ", rotary_dim,
                   " rotary dims (want half)");
  }
  for (const std::vector<float>* factors :
       {&rope.freq_factors, &rope.short_factors, &rope.long_factors}) {
    for (float factor : *factors) {
      if (!(factor > 0) || !std::isfinite(factor)) {
        return invalid("rope frequency factors must be positive");
      }
    }
  }
  if (!(rope.attention_factor >= 0) || !std::isfinite(rope.attention_factor)) {
    return invalid("the rope attention factor must be a non-negative number");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RopeConfig> ParseRopeParameters(const json& parameters, RopeConfig base) {
  LMSERVE_RETURN_IF_ERROR(ParseRopeScaling(parameters, &base));
  return base;
}

namespace {

// config.json's quantization_config: FP8 weights (Fp8CheckpointConfig) or an error naming what
// is not supported.
absl::Status ParseQuantizationConfig(const json& q, Fp8CheckpointConfig* out) {
  if (!q.is_object()) {
    return absl::InvalidArgumentError("config.json: 'quantization_config' is not an object");
  }
  std::string method;
  LMSERVE_RETURN_IF_ERROR(ReadString(q, "quant_method", &method));
  const std::string supported =
      "supported: FP8 E4M3 weights as quant_method 'fp8' (per tensor, or block-wise with "
      "weight_block_size) or 'compressed-tensors' (float weights of 8 bits, per tensor or per "
      "channel)";
  if (method == "fp8") {
    std::string fmt = "e4m3";
    LMSERVE_RETURN_IF_ERROR(ReadString(q, "fmt", &fmt));
    if (fmt != "e4m3") {
      return absl::UnimplementedError(
          StrCat("config.json: quantization_config fmt '", fmt, "' is not supported (", supported,
                 ")"));
    }
    if (auto it = q.find("weight_block_size"); it != q.end() && !it->is_null()) {
      if (!it->is_array() || it->size() != 2 || !(*it)[0].is_number_integer() ||
          !(*it)[1].is_number_integer() || (*it)[0].get<int64_t>() <= 0 ||
          (*it)[1].get<int64_t>() <= 0) {
        return absl::InvalidArgumentError(
            "config.json: quantization_config weight_block_size is not two positive integers");
      }
      out->block_rows = (*it)[0].get<int64_t>();
      out->block_cols = (*it)[1].get<int64_t>();
    }
  } else if (method == "compressed-tensors") {
    auto groups = q.find("config_groups");
    if (groups == q.end() || !groups->is_object() || groups->empty()) {
      return absl::InvalidArgumentError(
          "config.json: compressed-tensors quantization_config has no config_groups");
    }
    for (const auto& [name, group] : groups->items()) {
      const json* weights = group.is_object() && group.contains("weights") ? &group["weights"]
                                                                           : nullptr;
      if (weights == nullptr || !weights->is_object()) {
        return absl::InvalidArgumentError(StrCat(
            "config.json: compressed-tensors config group '", name, "' has no weights scheme"));
      }
      std::string type, strategy;
      int64_t bits = 0;
      LMSERVE_RETURN_IF_ERROR(ReadString(*weights, "type", &type));
      LMSERVE_RETURN_IF_ERROR(ReadString(*weights, "strategy", &strategy));
      LMSERVE_RETURN_IF_ERROR(ReadInt(*weights, "num_bits", &bits));
      if (type != "float" || bits != 8 || (strategy != "tensor" && strategy != "channel")) {
        return absl::UnimplementedError(
            StrCat("config.json: compressed-tensors weights of type '", type, "', ", bits,
                   " bits, strategy '", strategy, "' are not supported (", supported, ")"));
      }
    }
  } else {
    return absl::UnimplementedError(StrCat("config.json: quantization_config quant_method '",
                                           method, "' is not supported (", supported, ")"));
  }
  out->present = true;
  out->method = method;
  return absl::OkStatus();
}

}  // namespace

std::string Fp8CheckpointConfig::ScaleName(const std::string& weight_name) const {
  return StrCat(weight_name, block_rows > 0 ? "_scale_inv" : "_scale");
}

absl::StatusOr<ModelConfig> ParseHfConfig(const json& config, const json* generation_config) {
  if (!config.is_object()) return absl::InvalidArgumentError("config.json: not a JSON object");
  ModelConfig out;
  std::string arch;
  if (auto it = config.find("architectures");
      it != config.end() && it->is_array() && !it->empty() && (*it)[0].is_string()) {
    arch = (*it)[0].get<std::string>();
  }
  std::string model_type;
  LMSERVE_RETURN_IF_ERROR(ReadString(config, "model_type", &model_type));
  const ModelFamily* family = FindHfFamily(arch, model_type);
  if (family == nullptr) {
    return absl::UnimplementedError(
        StrCat("config.json: architecture '", arch.empty() ? model_type : arch,
               "' is not supported (supported: ", SupportedHfArchitectures(), ")"));
  }
  out.family = family->name;
  out.architecture_name =
      arch.empty() ? (family->hf_architectures.empty() ? family->name : family->hf_architectures[0])
                   : arch;
  LMSERVE_RETURN_IF_ERROR(ReadString(config, "_name_or_path", &out.name));

  LMSERVE_RETURN_IF_ERROR(ReadInt(config, "vocab_size", &out.vocab_size));
  LMSERVE_RETURN_IF_ERROR(ReadInt(config, "hidden_size", &out.hidden_size));
  LMSERVE_RETURN_IF_ERROR(ReadInt(config, "intermediate_size", &out.intermediate_size));
  LMSERVE_RETURN_IF_ERROR(ReadInt(config, "num_hidden_layers", &out.num_layers));
  LMSERVE_RETURN_IF_ERROR(ReadInt(config, "num_attention_heads", &out.num_attention_heads));
  out.num_kv_heads = out.num_attention_heads;
  LMSERVE_RETURN_IF_ERROR(ReadInt(config, "num_key_value_heads", &out.num_kv_heads));
  if (out.num_attention_heads > 0) out.head_dim = out.hidden_size / out.num_attention_heads;
  LMSERVE_RETURN_IF_ERROR(ReadInt(config, "head_dim", &out.head_dim));
  LMSERVE_RETURN_IF_ERROR(ReadInt(config, "max_position_embeddings", &out.max_position_embeddings));
  LMSERVE_RETURN_IF_ERROR(ReadDouble(config, "rms_norm_eps", &out.rms_norm_eps));
  LMSERVE_RETURN_IF_ERROR(ReadBool(config, "tie_word_embeddings", &out.tie_word_embeddings));
  if (auto it = config.find("quantization_config"); it != config.end() && !it->is_null()) {
    LMSERVE_RETURN_IF_ERROR(ParseQuantizationConfig(*it, &out.fp8));
  }
  LMSERVE_RETURN_IF_ERROR(ReadDouble(config, "rope_theta", &out.rope.theta));
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    if (!it->is_object()) {
      return absl::InvalidArgumentError(StrCat("config.json: '", key, "' is not an object"));
    }
    LMSERVE_RETURN_IF_ERROR(ParseRopeScaling(*it, &out.rope));
  }
  // Phi-3 keeps the pre-extension context at the top level; rope_parameters may repeat it.
  if (out.rope.scaling == RopeScaling::kLongRope &&
      config.contains("original_max_position_embeddings")) {
    LMSERVE_RETURN_IF_ERROR(ReadInt(config, "original_max_position_embeddings",
                                    &out.rope.original_max_position_embeddings));
  }
  if (out.rope.scaling == RopeScaling::kLongRope && out.rope.attention_factor == 0 &&
      out.rope.original_max_position_embeddings > 0) {
    out.rope.attention_factor = LongRopeAttentionFactor(out.max_position_embeddings,
                                                        out.rope.original_max_position_embeddings);
  }
  double partial_rotary_factor = 1.0;
  LMSERVE_RETURN_IF_ERROR(ReadDouble(config, "partial_rotary_factor", &partial_rotary_factor));
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    if (auto it = config.find(key); it != config.end() && it->is_object()) {
      LMSERVE_RETURN_IF_ERROR(ReadDouble(*it, "partial_rotary_factor", &partial_rotary_factor));
    }
  }
  if (!(partial_rotary_factor > 0 && partial_rotary_factor <= 1)) {
    return absl::InvalidArgumentError("config.json: partial_rotary_factor must be in (0, 1]");
  }
  if (partial_rotary_factor != 1.0) {
    // As transformers: int(head_dim * partial_rotary_factor).
    out.rope.rotary_dim =
        static_cast<int64_t>(static_cast<double>(out.head_dim) * partial_rotary_factor);
  }

  int64_t bos = -1;
  LMSERVE_RETURN_IF_ERROR(ReadInt(config, "bos_token_id", &bos));
  LMSERVE_RETURN_IF_ERROR(ReadTokenIds(config, "eos_token_id", &out.eos_token_ids));
  if (generation_config != nullptr && generation_config->is_object()) {
    LMSERVE_RETURN_IF_ERROR(ReadInt(*generation_config, "bos_token_id", &bos));
    LMSERVE_RETURN_IF_ERROR(ReadTokenIds(*generation_config, "eos_token_id", &out.eos_token_ids));
  }
  if (bos >= 0) out.bos_token_id = static_cast<int32_t>(bos);

  if (family->read_hf_config != nullptr) {
    LMSERVE_RETURN_IF_ERROR(family->read_hf_config(config, &out));
  }
  LMSERVE_RETURN_IF_ERROR(ValidateModelConfig(out));
  return out;
}

absl::StatusOr<ModelConfig> ShardModelConfig(const ModelConfig& config, int32_t size,
                                             int32_t rank) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        StrCat("tensor parallelism: rank ", rank, " of ", size, " ranks is out of range"));
  }
  if (config.tensor_parallel_size != 1) {
    return absl::InternalError("tensor parallelism: the config is already a rank's share");
  }
  if (size > 1 && config.ssm.num_heads > 0) {
    return absl::UnimplementedError(
        "tensor parallelism of models with state-space (Mamba) layers is not supported");
  }
  ModelConfig shard = config;
  shard.tensor_parallel_size = size;
  shard.tensor_parallel_rank = rank;
  shard.tensor_parallel_kv_slices = size;
  if (size == 1) return shard;
  // Fewer KV heads than ranks: each rank holds one, size / num_kv_heads ranks the same one.
  if (config.num_kv_heads < size && size % config.num_kv_heads == 0) {
    shard.tensor_parallel_kv_slices = config.num_kv_heads;
    shard.num_kv_heads = size;  // divided to 1 below
  }
  const std::pair<const char*, int64_t*> divided[] = {
      {"num_attention_heads", &shard.num_attention_heads},
      {"num_key_value_heads", &shard.num_kv_heads},
      {"intermediate_size", &shard.intermediate_size},
      {"moe_intermediate_size", &shard.moe_intermediate_size}};
  for (auto [what, value] : divided) {
    if (*value % size != 0) {
      return absl::InvalidArgumentError(
          StrCat("--tensor-parallel-size ", size, " does not divide the model's ", what, " (",
                 *value, "): each rank must hold an equal share of it; choose a size that divides ",
                 "num_attention_heads and the MLP widths, and divides or is a multiple of ",
                 "num_key_value_heads"));
    }
    *value /= size;
  }
  return shard;
}

int64_t VocabShardRows(const ModelConfig& config) {
  return (config.vocab_size + config.tensor_parallel_size - 1) / config.tensor_parallel_size;
}

namespace {

absl::Status ValidateSsm(const ModelConfig& c) {
  const SsmConfig& s = c.ssm;
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(StrCat("model config: ", parts...));
  };
  // Bounds far above real models (Mamba-2 2.7B: 80 heads of 64, state 128, kernel 4) that the
  // kernels support.
  for (auto [what, value, limit] :
       {std::tuple<const char*, int64_t, int64_t>{"ssm num_heads", s.num_heads, 4096},
        {"ssm head_dim", s.head_dim, 1024},
        {"ssm state_size", s.state_size, 256},
        {"ssm n_groups", s.n_groups, 1024},
        {"ssm conv_kernel", s.conv_kernel, 8},
        {"ssm chunk_size", s.chunk_size, 4096},
        {"ssm norm_groups", s.norm_groups, 1024}}) {
    if (value <= 0 || value > limit) {
      return invalid(what, " = ", value, " is outside the supported range [1, ", limit, "]");
    }
  }
  if (s.num_heads % s.n_groups != 0) {
    return invalid("ssm num_heads (", s.num_heads, ") is not a multiple of n_groups (", s.n_groups,
                   ")");
  }
  if (s.inner() % s.norm_groups != 0) {
    return invalid("ssm inner size (", s.inner(), ") is not a multiple of the norm's groups (",
                   s.norm_groups, ")");
  }
  if (!(s.time_step_min >= 0) || !(s.time_step_max >= 0) ||
      (s.time_step_max > 0 && s.time_step_max < s.time_step_min)) {
    return invalid("ssm time step limits [", s.time_step_min, ", ", s.time_step_max,
                   "] are not a range of non-negative numbers");
  }
  if (!c.ssm_layers.empty() && static_cast<int64_t>(c.ssm_layers.size()) != c.num_layers) {
    return invalid(c.ssm_layers.size(), " layer kinds for ", c.num_layers, " layers");
  }
  return absl::OkStatus();
}

}  // namespace

bool IsSsmLayer(const ModelConfig& c, int64_t layer) {
  if (c.ssm.num_heads <= 0) return false;
  return c.ssm_layers.empty() ||
         (layer < static_cast<int64_t>(c.ssm_layers.size()) && c.ssm_layers[static_cast<size_t>(layer)]);
}

int64_t NumSsmLayers(const ModelConfig& c) {
  int64_t count = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) count += IsSsmLayer(c, l) ? 1 : 0;
  return count;
}

bool HasAttentionLayers(const ModelConfig& c) { return NumSsmLayers(c) < c.num_layers; }

absl::Status ValidateModelConfig(const ModelConfig& c) {
  auto positive = [](const char* what, int64_t value) -> absl::Status {
    if (value > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        StrCat("model config: ", what, " must be positive (got ", value, ")"));
  };
  for (auto [what, value] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
                             {"hidden_size", c.hidden_size},
                             {"num_hidden_layers", c.num_layers},
                             {"max_position_embeddings", c.max_position_embeddings}}) {
    LMSERVE_RETURN_IF_ERROR(positive(what, value));
  }
  const bool attention = HasAttentionLayers(c);
  if (attention) {
    for (auto [what, value] : {std::pair<const char*, int64_t>{"intermediate_size", c.intermediate_size},
                               {"num_attention_heads", c.num_attention_heads},
                               {"num_key_value_heads", c.num_kv_heads},
                               {"head_dim", c.head_dim}}) {
      LMSERVE_RETURN_IF_ERROR(positive(what, value));
    }
  }
  if (c.ssm.num_heads > 0) LMSERVE_RETURN_IF_ERROR(ValidateSsm(c));
  // Bounds far above any real model; they keep a corrupt config from asking for absurd memory.
  for (auto [what, value, limit] :
       {std::tuple<const char*, int64_t, int64_t>{"vocab_size", c.vocab_size, int64_t{1} << 24},
        {"hidden_size", c.hidden_size, int64_t{1} << 17},
        {"intermediate_size", c.intermediate_size, int64_t{1} << 20},
        {"num_hidden_layers", c.num_layers, 1024},
        {"num_attention_heads", c.num_attention_heads, 1024},
        {"head_dim", c.head_dim, 1024},
        {"max_position_embeddings", c.max_position_embeddings, int64_t{1} << 24}}) {
    if (value > limit) {
      return absl::InvalidArgumentError(
          StrCat("model config: ", what, " = ", value, " exceeds the supported maximum ", limit));
    }
  }
  if (attention && c.num_attention_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        StrCat("model config: num_attention_heads (", c.num_attention_heads,
               ") is not a multiple of num_key_value_heads (", c.num_kv_heads, ")"));
  }
  if (c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        StrCat("model config: head_dim must be even for rotary embedding (got ", c.head_dim, ")"));
  }
  if (!(c.rms_norm_eps > 0)) {
    return absl::InvalidArgumentError("model config: rms_norm_eps must be positive");
  }
  if (attention) LMSERVE_RETURN_IF_ERROR(ValidateRope(c.rope, c, "rope"));
  if (attention && c.local_rope.has_value())
    LMSERVE_RETURN_IF_ERROR(ValidateRope(*c.local_rope, c, "local rope"));
  if (c.sliding_window < 0) {
    return absl::InvalidArgumentError("model config: sliding_window must not be negative");
  }
  if (!c.sliding_layers.empty() && static_cast<int64_t>(c.sliding_layers.size()) != c.num_layers) {
    return absl::InvalidArgumentError(StrCat("model config: ", c.sliding_layers.size(),
                                             " layer types for ", c.num_layers, " layers"));
  }
  for (auto [what, value] :
       {std::pair<const char*, double>{"query_pre_attn_scalar", c.query_pre_attn_scalar},
        {"attn_logit_softcapping", c.attn_logit_softcap},
        {"final_logit_softcapping", c.final_logit_softcap}}) {
    if (!(value >= 0) || !std::isfinite(value)) {
      return absl::InvalidArgumentError(
          StrCat("model config: ", what, " must be a non-negative number (got ", value, ")"));
    }
  }
  if (c.num_experts < 0) {
    return absl::InvalidArgumentError(
        StrCat("model config: num_experts must not be negative (got ", c.num_experts, ")"));
  }
  if (c.num_experts > 0) {
    // Bounds of the MoE kernels (kernels/cpu/moe.h, kernels/cuda/moe.h): far above real models.
    if (c.num_experts > 256 || c.num_experts_per_tok < 1 ||
        c.num_experts_per_tok > std::min<int64_t>(c.num_experts, 32)) {
      return absl::InvalidArgumentError(
          StrCat("model config: ", c.num_experts, " experts with ", c.num_experts_per_tok,
                 " per token are not supported (at most 256 experts; 1 to min(experts, 32) "
                 "per token)"));
    }
    LMSERVE_RETURN_IF_ERROR(positive("moe_intermediate_size", c.moe_intermediate_size));
    LMSERVE_RETURN_IF_ERROR(positive("decoder_sparse_step", c.decoder_sparse_step));
    if (c.moe_intermediate_size > (int64_t{1} << 20)) {
      return absl::InvalidArgumentError(
          StrCat("model config: moe_intermediate_size = ", c.moe_intermediate_size,
                 " exceeds the supported maximum ", int64_t{1} << 20));
    }
  }
  for (int32_t id : c.eos_token_ids) {
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(
          StrCat("model config: eos_token_id ", id, " is outside the vocabulary"));
    }
  }
  return absl::OkStatus();
}

double LongRopeAttentionFactor(int64_t max_position_embeddings,
                               int64_t original_max_position_embeddings) {
  const double original = static_cast<double>(original_max_position_embeddings);
  const double extension = static_cast<double>(max_position_embeddings) / original;
  return extension <= 1.0 ? 1.0 : std::sqrt(1.0 + std::log(extension) / std::log(original));
}

int64_t RotaryDim(const RopeConfig& rope, int64_t head_dim) {
  return rope.rotary_dim > 0 ? rope.rotary_dim : head_dim;
}

RopeConfig RopeForContext(const RopeConfig& rope, int64_t context_len) {
  if (rope.scaling != RopeScaling::kLongRope || !rope.freq_factors.empty()) return rope;
  RopeConfig out = rope;
  const bool extended = context_len > rope.original_max_position_embeddings;
  out.freq_factors = extended ? rope.long_factors : rope.short_factors;
  return out;
}

bool IsMoeLayer(const ModelConfig& c, int64_t layer) {
  if (c.num_experts <= 0 || c.decoder_sparse_step <= 0) return false;
  if (std::find(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), layer) !=
      c.mlp_only_layers.end()) {
    return false;
  }
  return (layer + 1) % c.decoder_sparse_step == 0;
}

std::vector<double> RopeInverseFrequencies(const RopeConfig& rope, int64_t head_dim) {
  const int64_t rotary_dim = RotaryDim(rope, head_dim);
  const int64_t pairs = rotary_dim / 2;
  std::vector<double> inv_freq(pairs);
  for (int64_t i = 0; i < pairs; ++i) {
    inv_freq[i] = 1.0 / std::pow(rope.theta, static_cast<double>(2 * i) / rotary_dim);
  }
  const std::vector<float>& factors =
      !rope.freq_factors.empty() || rope.scaling != RopeScaling::kLongRope ? rope.freq_factors
                                                                           : rope.short_factors;
  if (!factors.empty()) {
    for (int64_t i = 0; i < pairs; ++i) inv_freq[i] /= factors[i];
    return inv_freq;
  }
  switch (rope.scaling) {
    case RopeScaling::kDefault:
    case RopeScaling::kLongRope:
      break;
    case RopeScaling::kLinear:
      for (double& f : inv_freq) f /= rope.factor;
      break;
    case RopeScaling::kLlama3: {
      const double old_context = static_cast<double>(rope.original_max_position_embeddings);
      const double low_freq_wavelen = old_context / rope.low_freq_factor;
      const double high_freq_wavelen = old_context / rope.high_freq_factor;
      for (double& f : inv_freq) {
        const double wavelen = 2 * std::numbers::pi / f;
        if (wavelen < high_freq_wavelen) continue;  // high frequency: unchanged
        if (wavelen > low_freq_wavelen) {           // low frequency: scaled
          f /= rope.factor;
          continue;
        }
        const double smooth = (old_context / wavelen - rope.low_freq_factor) /
                              (rope.high_freq_factor - rope.low_freq_factor);
        f = (1 - smooth) * f / rope.factor + smooth * f;
      }
      break;
    }
  }
  return inv_freq;
}

}  // namespace lmserve::engine
