// GGUF checkpoints: the model configuration from the {arch}.* metadata, tensors renamed to Hugging
// Face names and their shapes reversed to outermost-first.
//
// Mixtures of experts: llama.cpp stores a layer's experts as 3-D tensors, ffn_{gate,up,down}_exps
// ([experts, rows, cols] outermost first), and the router as ffn_gate_inp. Each expert's slice is
// a view of its own, named as the family's Hugging Face checkpoints name it
// (ModelFamily::moe_names): a slice is whole rows, so this holds for the block formats too.
//
// Rotary layout: llama.cpp's converter permutes the Q/K rows of llama-architecture models so that
// rotary pairs are adjacent (dims 2i, 2i+1). The rows are kept as stored and the config says so
// (ModelFamily::gguf_rope_layout: kInterleaved for llama; qwen2 files are not permuted).

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/model/checkpoint.h"
#include "engine/model/family.h"
#include "engine/model/gguf.h"
#include "kernels/cpu/dequant.h"

namespace lmserve::engine {
namespace {

class GgufCheckpoint : public Checkpoint {
 public:
  CheckpointFormat format() const override { return CheckpointFormat::kGguf; }
  const std::string& path() const override { return path_; }
  const ModelConfig& config() const override { return config_; }
  const std::map<std::string, TensorView, std::less<>>& tensors() const override {
    return tensors_;
  }
  const GgufFile* gguf() const override { return file_.get(); }
  void DropPages(const TensorView& tensor) const override {
    if (file_ != nullptr) file_->file().DropPages(tensor.data, static_cast<size_t>(tensor.num_bytes));
  }

  std::string path_;
  ModelConfig config_;
  std::unique_ptr<GgufFile> file_;
  std::map<std::string, TensorView, std::less<>> tensors_;
};

// GGUF tensor names (the part after "blk.N." for layers) and their Hugging Face names.
constexpr std::pair<std::string_view, std::string_view> kGlobalNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};
constexpr std::pair<std::string_view, std::string_view> kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.bias", "self_attn.o_proj.bias"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

constexpr std::string_view kRopeFreqsTensor = "rope_freqs.weight";
constexpr std::string_view kRopeLongFactorsTensor = "rope_factors_long.weight";
constexpr std::string_view kRopeShortFactorsTensor = "rope_factors_short.weight";

// Sizes beyond these are rejected before anything is sized by them (they would overflow products).
constexpr int64_t kMaxModelDim = int64_t{1} << 24;
constexpr int64_t kMaxContextLength = int64_t{1} << 31;

// Appends the GGUF name to a message that quotes a Hugging Face tensor name.
absl::Status WithGgufName(const ModelFamily* family, const absl::Status& status) {
  const std::string message(status.message());
  const size_t open = message.find('\'');
  const size_t close = open == std::string::npos ? open : message.find('\'', open + 1);
  if (close == std::string::npos) return status;
  std::optional<std::string> gguf =
      HfToGgufTensorName(family, message.substr(open + 1, close - open - 1));
  if (!gguf.has_value()) return status;
  return absl::Status(status.code(), StrCat(message, " (GGUF tensor '", *gguf, "')"));
}

// Reads the model configuration. `path` prefixes every message.
absl::StatusOr<ModelConfig> ReadConfig(const GgufFile& file) {
  const std::string& path = file.path();
  ModelConfig c;
  const std::optional<std::string> arch = file.GetString("general.architecture");
  if (!arch.has_value()) {
    return absl::InvalidArgumentError(
        StrCat(path, ": metadata key 'general.architecture' is missing or not a string"));
  }
  const std::optional<int64_t> expert_count = file.GetInt(StrCat(*arch, ".expert_count"));
  const bool has_experts = expert_count.value_or(0) > 0;
  const ModelFamily* family = FindGgufFamily(*arch, has_experts);
  if (family == nullptr) {
    return absl::UnimplementedError(
        StrCat(path, ": architecture '", *arch,
               "' is not supported (supported: ", SupportedGgufArchitectures(), ")"));
  }
  c.family = family->name;
  c.rope.layout = family->gguf_rope_layout;
  c.architecture_name = *arch;
  c.name = file.GetString("general.name").value_or(std::filesystem::path(path).stem().string());

  auto required_int = [&](std::string_view suffix, int64_t* out) -> absl::Status {
    const std::string key = StrCat(*arch, ".", suffix);
    std::optional<int64_t> value = file.GetInt(key);
    if (!value.has_value()) {
      return absl::InvalidArgumentError(
          StrCat(path, ": metadata key '", key, "' is missing or not an integer"));
    }
    *out = *value;
    return absl::OkStatus();
  };
  auto optional_int = [&](std::string_view suffix, int64_t* out) -> absl::Status {
    const std::string key = StrCat(*arch, ".", suffix);
    const GgufValue* value = file.Find(key);
    if (value == nullptr) return absl::OkStatus();
    if (!value->AsInt().has_value()) {
      return absl::InvalidArgumentError(StrCat(path, ": metadata key '", key, "' has type ",
                                               GgufTypeName(value->type), ", expected an integer"));
    }
    *out = *value->AsInt();
    return absl::OkStatus();
  };
  auto optional_float = [&](std::string_view suffix, double* out) -> absl::Status {
    const std::string key = StrCat(*arch, ".", suffix);
    const GgufValue* value = file.Find(key);
    if (value == nullptr) return absl::OkStatus();
    if (!value->AsFloat().has_value()) {
      return absl::InvalidArgumentError(StrCat(path, ": metadata key '", key, "' has type ",
                                               GgufTypeName(value->type), ", expected f32"));
    }
    *out = *value->AsFloat();
    return absl::OkStatus();
  };
  for (const auto& [suffix, out] :
       {std::pair<std::string_view, int64_t*>{"context_length", &c.max_position_embeddings},
        {"embedding_length", &c.hidden_size},
        {"feed_forward_length", &c.intermediate_size},
        {"block_count", &c.num_layers},
        {"attention.head_count", &c.num_attention_heads}}) {
    LMSERVE_RETURN_IF_ERROR(required_int(suffix, out));
  }
  c.num_kv_heads = c.num_attention_heads;
  LMSERVE_RETURN_IF_ERROR(optional_int("attention.head_count_kv", &c.num_kv_heads));
  if (c.num_attention_heads > 0) c.head_dim = c.hidden_size / c.num_attention_heads;
  LMSERVE_RETURN_IF_ERROR(optional_int("attention.key_length", &c.head_dim));
  for (const auto& [what, value] :
       {std::pair<std::string_view, int64_t>{"embedding_length", c.hidden_size},
        {"feed_forward_length", c.intermediate_size},
        {"block_count", c.num_layers},
        {"attention.head_count", c.num_attention_heads},
        {"attention.head_count_kv", c.num_kv_heads},
        {"attention.key_length", c.head_dim}}) {
    if (value > kMaxModelDim) {
      return absl::InvalidArgumentError(
          StrCat(path, ": ", *arch, ".", what, " is ", value, ", beyond any supported model"));
    }
  }
  if (c.max_position_embeddings > kMaxContextLength) {
    return absl::InvalidArgumentError(StrCat(path, ": ", *arch, ".context_length is ",
                                             c.max_position_embeddings,
                                             ", beyond any supported model"));
  }
  int64_t value_length = c.head_dim, rope_dims = c.head_dim;
  LMSERVE_RETURN_IF_ERROR(optional_int("attention.value_length", &value_length));
  LMSERVE_RETURN_IF_ERROR(optional_int("rope.dimension_count", &rope_dims));
  if (value_length != c.head_dim) {
    return absl::UnimplementedError(StrCat(path, ": ", *arch, ".attention.value_length ",
                                           value_length, " differs from the key length ",
                                           c.head_dim));
  }
  if (rope_dims <= 0 || rope_dims > c.head_dim || rope_dims % 2 != 0) {
    return absl::InvalidArgumentError(StrCat(path, ": ", *arch, ".rope.dimension_count ", rope_dims,
                                             " is not an even count of at most the ",
                                             "head dimension ", c.head_dim));
  }
  if (rope_dims != c.head_dim) c.rope.rotary_dim = rope_dims;  // partial rotary embedding
  int64_t window = 0;
  LMSERVE_RETURN_IF_ERROR(optional_int("attention.sliding_window", &window));
  if (window < 0 || window > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        StrCat(path, ": ", *arch, ".attention.sliding_window is ", window));
  }
  if (window < c.max_position_embeddings) c.sliding_window = static_cast<int32_t>(window);
  LMSERVE_RETURN_IF_ERROR(optional_float("rope.freq_base", &c.rope.theta));
  LMSERVE_RETURN_IF_ERROR(optional_float("attention.layer_norm_rms_epsilon", &c.rms_norm_eps));
  const std::string scaling = file.GetString(StrCat(*arch, ".rope.scaling.type")).value_or("none");
  if (scaling == "linear") {
    c.rope.scaling = RopeScaling::kLinear;
    LMSERVE_RETURN_IF_ERROR(optional_float("rope.scaling.factor", &c.rope.factor));
    if (!(c.rope.factor > 0)) {
      return absl::InvalidArgumentError(
          StrCat(path, ": ", *arch, ".rope.scaling.factor must be positive"));
    }
  } else if (scaling != "none") {
    return absl::UnimplementedError(StrCat(path, ": rope scaling type '", scaling,
                                           "' is not supported (supported: none, linear)"));
  }

  if (has_experts) {
    if (!family->moe_names.has_value()) {
      return absl::UnimplementedError(
          StrCat(path, ": experts on a ", *arch, "-architecture model are not supported"));
    }
    c.num_experts = *expert_count;
    LMSERVE_RETURN_IF_ERROR(required_int("expert_used_count", &c.num_experts_per_tok));
    c.moe_intermediate_size = c.intermediate_size;
    LMSERVE_RETURN_IF_ERROR(optional_int("expert_feed_forward_length", &c.moe_intermediate_size));
    if (c.num_experts > kMaxModelDim || c.moe_intermediate_size > kMaxModelDim) {
      return absl::InvalidArgumentError(StrCat(path, ": ", *arch, ".expert_count or ", *arch,
                                               ".expert_feed_forward_length is beyond any "
                                               "supported model"));
    }
    // llama.cpp renormalizes the top-k weights unless a file says otherwise.
    const std::string norm_key = StrCat(*arch, ".expert_weights_norm");
    if (const GgufValue* norm = file.Find(norm_key); norm != nullptr) {
      if (norm->type != GgufType::kBool) {
        return absl::InvalidArgumentError(StrCat(path, ": metadata key '", norm_key, "' has type ",
                                                 GgufTypeName(norm->type), ", expected bool"));
      }
      c.norm_topk_prob = norm->int_value != 0;
    }
  }
  if (family->read_gguf_config != nullptr) {
    LMSERVE_RETURN_IF_ERROR(family->read_gguf_config(file, &c));
  }
  // Token ids: a negative id is llama.cpp's "no such token" and is skipped.
  auto token_id = [&](const char* key) -> absl::StatusOr<std::optional<int32_t>> {
    const GgufValue* value = file.Find(key);
    if (value == nullptr) return std::nullopt;
    const std::optional<int64_t> id = value->AsInt();
    if (!id.has_value() || *id > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          StrCat(path, ": metadata key '", key, "' is ", value->ToString(), ", not a token id"));
    }
    if (*id < 0) return std::nullopt;
    return static_cast<int32_t>(*id);
  };
  absl::StatusOr<std::optional<int32_t>> bos = token_id("tokenizer.ggml.bos_token_id");
  if (!bos.ok()) return bos.status();
  c.bos_token_id = *bos;
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    absl::StatusOr<std::optional<int32_t>> id = token_id(key);
    if (!id.ok()) return id.status();
    if (id->has_value() &&
        std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), **id) == c.eos_token_ids.end()) {
      c.eos_token_ids.push_back(**id);
    }
  }
  return c;
}

// The layer of "blk.L.<suffix>" whose suffix is `suffix`; nullopt for other names.
std::optional<int64_t> LayerOf(std::string_view gguf_name, std::string_view suffix) {
  constexpr std::string_view kBlk = "blk.";
  if (!gguf_name.starts_with(kBlk) || !gguf_name.ends_with(suffix)) return std::nullopt;
  const std::string_view rest = gguf_name.substr(kBlk.size());
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos || rest.substr(dot + 1) != suffix) return std::nullopt;
  const std::optional<int64_t> layer = ParseInt<int64_t>(rest.substr(0, dot));
  if (!layer.has_value() || *layer < 0) return std::nullopt;
  return layer;
}

// The Hugging Face views of a mixture-of-experts tensor: the router as it is, each expert's
// slice of a 3-D expert tensor; empty for other tensors.
absl::StatusOr<std::vector<TensorView>> ExpertViews(const GgufTensorInfo& info,
                                                    const ModelConfig& c,
                                                    const MoeTensorNames& names,
                                                    const std::string& path) {
  std::vector<TensorView> views;
  auto view_of = [&](std::string name) {
    TensorView view;
    view.name = std::move(name);
    view.file = path;
    view.dtype = info.dtype;
    view.shape.assign(info.dims.rbegin(), info.dims.rend());
    view.data = info.data;
    view.num_bytes = info.num_bytes;
    return view;
  };
  if (std::optional<int64_t> layer = LayerOf(info.name, "ffn_gate_inp.weight")) {
    views.push_back(view_of(LayerTensorName(*layer, names.router)));
    return views;
  }
  for (const auto& [suffix, projection] :
       {std::pair<std::string_view, const std::string*>{"ffn_gate_exps.weight", &names.gate},
        {"ffn_up_exps.weight", &names.up},
        {"ffn_down_exps.weight", &names.down}}) {
    const std::optional<int64_t> layer = LayerOf(info.name, suffix);
    if (!layer.has_value()) continue;
    const int64_t experts = info.dims.size() == 3 ? info.dims[2] : 0;
    if (experts != c.num_experts || info.num_bytes % experts != 0) {
      return absl::InvalidArgumentError(
          StrCat(path, ": tensor '", info.name, "' has ", info.dims.size(),
                 " dimensions (outermost ", info.dims.empty() ? 0 : info.dims.back(),
                 "); expected 3 with ", c.num_experts, " experts outermost"));
    }
    const int64_t expert_bytes = info.num_bytes / experts;
    for (int64_t e = 0; e < experts; ++e) {
      TensorView view = view_of(names.Expert(*layer, e, *projection));
      view.shape = {info.dims[1], info.dims[0]};
      view.data = info.data + e * expert_bytes;
      view.num_bytes = expert_bytes;
      views.push_back(std::move(view));
    }
    return views;
  }
  return views;
}

}  // namespace

std::optional<std::string> GgufToHfTensorName(const ModelFamily* family,
                                              std::string_view gguf_name) {
  for (const auto& [gguf, hf] : kGlobalNames) {
    if (gguf_name == gguf) return std::string(hf);
  }
  constexpr std::string_view kBlk = "blk.";
  if (gguf_name.substr(0, kBlk.size()) != kBlk) return std::nullopt;
  const std::string_view rest = gguf_name.substr(kBlk.size());
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  const std::optional<int64_t> layer = ParseInt<int64_t>(rest.substr(0, dot));
  if (!layer.has_value() || *layer < 0) return std::nullopt;
  const std::string_view suffix = rest.substr(dot + 1);
  if (family != nullptr) {
    for (const auto& [gguf, hf] : family->gguf_layer_names) {
      if (suffix == gguf) return LayerTensorName(*layer, hf);
    }
  }
  for (const auto& [gguf, hf] : kLayerNames) {
    if (suffix == gguf) return LayerTensorName(*layer, hf);
  }
  return std::nullopt;
}

std::optional<std::string> HfToGgufTensorName(const ModelFamily* family, std::string_view hf_name) {
  for (const auto& [gguf, hf] : kGlobalNames) {
    if (hf_name == hf) return std::string(gguf);
  }
  constexpr std::string_view kLayers = "model.layers.";
  if (hf_name.substr(0, kLayers.size()) != kLayers) return std::nullopt;
  const std::string_view rest = hf_name.substr(kLayers.size());
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  const std::optional<int64_t> layer = ParseInt<int64_t>(rest.substr(0, dot));
  if (!layer.has_value() || *layer < 0) return std::nullopt;
  const std::string_view suffix = rest.substr(dot + 1);
  if (family != nullptr) {
    for (const auto& [gguf, hf] : family->gguf_layer_names) {
      if (suffix == hf) return StrCat("blk.", *layer, ".", gguf);
    }
  }
  for (const auto& names : kLayerNames) {
    if (suffix != names.second) continue;
    const std::string_view gguf = names.first;
    // A GGUF name the family gives another tensor is not this one's.
    if (family != nullptr &&
        std::any_of(family->gguf_layer_names.begin(), family->gguf_layer_names.end(),
                    [gguf](const auto& own) { return own.first == gguf; })) {
      return std::nullopt;
    }
    return StrCat("blk.", *layer, ".", gguf);
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> GgufCheckpointFromFile(std::unique_ptr<GgufFile> file) {
  auto checkpoint = std::make_unique<GgufCheckpoint>();
  checkpoint->path_ = file->path();
  const std::string& path = checkpoint->path_;
  absl::StatusOr<ModelConfig> config = ReadConfig(*file);
  if (!config.ok()) return config.status();
  ModelConfig& c = checkpoint->config_;
  c = *std::move(config);
  const ModelFamily* family = FindFamily(c.family);

  for (const GgufTensorInfo& info : file->tensors()) {
    if (c.num_experts > 0 && family != nullptr && family->moe_names.has_value()) {
      LMSERVE_ASSIGN_OR_RETURN(std::vector<TensorView> experts,
                               ExpertViews(info, c, *family->moe_names, path));
      bool added = !experts.empty();
      for (TensorView& view : experts) {
        std::string hf = view.name;
        if (!checkpoint->tensors_.emplace(hf, std::move(view)).second) {
          return absl::InvalidArgumentError(
              StrCat(path, ": tensor '", info.name, "' is a second '", hf, "'"));
        }
      }
      if (added) continue;
    }
    std::optional<std::string> hf_name = GgufToHfTensorName(family, info.name);
    if (!hf_name.has_value()) continue;  // tensors the decoder does not use
    TensorView view;
    view.name = *hf_name;
    view.file = path;
    view.dtype = info.dtype;
    view.shape.assign(info.dims.rbegin(), info.dims.rend());
    view.data = info.data;
    view.num_bytes = info.num_bytes;
    const std::string hf = view.name;
    if (!checkpoint->tensors_.emplace(hf, std::move(view)).second) {
      return absl::InvalidArgumentError(StrCat(path, ": tensor '", info.name, "' is a second '", hf,
                                               "' (another tensor has that name too)"));
    }
  }

  // Shapes the config depends on.
  absl::StatusOr<const TensorView*> embed = checkpoint->Find("model.embed_tokens.weight");
  if (!embed.ok()) return WithGgufName(family, embed.status());
  if ((*embed)->shape.size() != 2) {
    return absl::InvalidArgumentError(StrCat(path, ": tensor 'token_embd.weight' has shape ",
                                             (*embed)->ShapeString(), ", expected 2 dimensions"));
  }
  c.vocab_size = (*embed)->shape[0];
  c.tie_word_embeddings = !checkpoint->tensors_.contains("lm_head.weight");
  if (!c.attention_bias &&
      checkpoint->tensors_.contains(LayerTensorName(0, "self_attn.q_proj.bias"))) {
    return absl::UnimplementedError(StrCat(path, ": attention biases on a ", c.architecture_name,
                                           "-architecture model are not supported"));
  }

  if (const GgufTensorInfo* freqs = file->FindTensor(kRopeFreqsTensor); freqs != nullptr) {
    if (freqs->dims.size() != 1 || freqs->dims[0] != c.head_dim / 2) {
      return absl::InvalidArgumentError(StrCat(
          path, ": tensor '", kRopeFreqsTensor, "' has ", freqs->NumElements(), " elements in ",
          freqs->dims.size(), " dimensions, expected [", c.head_dim / 2, "] (head_dim / 2)"));
    }
    c.rope.freq_factors.resize(static_cast<size_t>(freqs->dims[0]));
    kernels::DequantizeToF32(freqs->dtype, freqs->data, c.rope.freq_factors.data(), freqs->dims[0]);
    for (float f : c.rope.freq_factors) {
      if (!(f > 0) || f == std::numeric_limits<float>::infinity()) {
        return absl::InvalidArgumentError(StrCat(path, ": tensor '", kRopeFreqsTensor,
                                                 "' holds a factor that is not positive and "
                                                 "finite (",
                                                 f, ")"));
      }
    }
  }

  // longrope (Phi-3): the short and long factors as tensors, llama.cpp's scaling keys beside.
  const GgufTensorInfo* long_factors = file->FindTensor(kRopeLongFactorsTensor);
  const GgufTensorInfo* short_factors = file->FindTensor(kRopeShortFactorsTensor);
  if ((long_factors == nullptr) != (short_factors == nullptr)) {
    return absl::InvalidArgumentError(StrCat(path, ": one of '", kRopeLongFactorsTensor, "' and '",
                                             kRopeShortFactorsTensor, "' without the other"));
  }
  if (long_factors != nullptr) {
    const int64_t pairs = RotaryDim(c.rope, c.head_dim) / 2;
    for (const GgufTensorInfo* factors : {long_factors, short_factors}) {
      if (factors->dims.size() != 1 || factors->dims[0] != pairs) {
        return absl::InvalidArgumentError(StrCat(path, ": tensor '", factors->name, "' has ",
                                                 factors->NumElements(), " elements, expected [",
                                                 pairs, "] (rotary dims / 2)"));
      }
    }
    c.rope.scaling = RopeScaling::kLongRope;
    c.rope.long_factors.resize(static_cast<size_t>(pairs));
    c.rope.short_factors.resize(static_cast<size_t>(pairs));
    kernels::DequantizeToF32(long_factors->dtype, long_factors->data, c.rope.long_factors.data(),
                             pairs);
    kernels::DequantizeToF32(short_factors->dtype, short_factors->data, c.rope.short_factors.data(),
                             pairs);
    const std::string arch = c.architecture_name;
    if (std::optional<int64_t> original =
            file->GetInt(StrCat(arch, ".rope.scaling.original_context_length"));
        original.has_value()) {
      c.rope.original_max_position_embeddings = *original;
    }
    if (std::optional<double> factor = file->GetFloat(StrCat(arch, ".rope.scaling.attn_factor"));
        factor.has_value()) {
      c.rope.attention_factor = *factor;
    } else {
      c.rope.attention_factor = LongRopeAttentionFactor(c.max_position_embeddings,
                                                        c.rope.original_max_position_embeddings);
    }
  }

  if (absl::Status s = ValidateModelConfig(c); !s.ok()) {
    return absl::Status(s.code(), StrCat(path, ": ", s.message()));
  }
  // Every layer has at least 9 tensors: a block count beyond that cannot be right, and bounds the
  // work of the check below.
  if (static_cast<uint64_t>(c.num_layers) > file->tensors().size()) {
    return absl::InvalidArgumentError(StrCat(path, ": ", c.architecture_name, ".block_count is ",
                                             c.num_layers, " but the file has only ",
                                             file->tensors().size(), " tensors"));
  }
  checkpoint->file_ = std::move(file);
  if (absl::Status s = ValidateCheckpointTensors(*checkpoint); !s.ok()) {
    return WithGgufName(family, s);
  }
  return checkpoint;
}

absl::StatusOr<std::unique_ptr<Checkpoint>> OpenGgufCheckpoint(const std::string& path) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  if (!file.ok()) return file.status();
  return GgufCheckpointFromFile(*std::move(file));
}

}  // namespace lmserve::engine
