#include "engine/model/gguf_writer.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/status/status.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/model/family.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/half.h"

namespace lmserve::engine {
namespace {

using kernels::DType;

constexpr uint32_t kGgufVersion = 3;
constexpr uint32_t kQuantizationVersion = 2;  // GGML_QUANT_VERSION

// llama_ftype of general.file_type.
constexpr uint32_t kFileTypeAllF32 = 0;
constexpr uint32_t kFileTypeMostlyF16 = 1;
constexpr uint32_t kFileTypeMostlyQ4_0 = 2;
constexpr uint32_t kFileTypeMostlyQ8_0 = 7;
constexpr uint32_t kFileTypeMostlyQ4_KS = 14;
constexpr uint32_t kFileTypeMostlyQ4_KM = 15;
constexpr uint32_t kFileTypeMostlyQ6_K = 18;

template <typename T>
void AppendPod(std::string* out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out->append(bytes, sizeof(T));
}

void AppendString(std::string* out, std::string_view s) {
  AppendPod<uint64_t>(out, s.size());
  out->append(s);
}

// The value's payload (not its type id).
void AppendValue(std::string* out, const GgufValue& v) {
  switch (v.type) {
    case GgufType::kUint8:
      return AppendPod(out, static_cast<uint8_t>(v.uint_value));
    case GgufType::kUint16:
      return AppendPod(out, static_cast<uint16_t>(v.uint_value));
    case GgufType::kUint32:
      return AppendPod(out, static_cast<uint32_t>(v.uint_value));
    case GgufType::kUint64:
      return AppendPod(out, v.uint_value);
    case GgufType::kInt8:
      return AppendPod(out, static_cast<int8_t>(v.int_value));
    case GgufType::kInt16:
      return AppendPod(out, static_cast<int16_t>(v.int_value));
    case GgufType::kInt32:
      return AppendPod(out, static_cast<int32_t>(v.int_value));
    case GgufType::kInt64:
      return AppendPod(out, v.int_value);
    case GgufType::kFloat32:
      return AppendPod(out, static_cast<float>(v.float_value));
    case GgufType::kFloat64:
      return AppendPod(out, v.float_value);
    case GgufType::kBool:
      return AppendPod(out, static_cast<uint8_t>(v.int_value != 0));
    case GgufType::kString:
      return AppendString(out, v.string_value);
    case GgufType::kArray:
      AppendPod(out, static_cast<uint32_t>(v.element_type));
      AppendPod<uint64_t>(out, v.elements.size());
      for (const GgufValue& e : v.elements) AppendValue(out, e);
      return;
  }
}

uint64_t PadTo(uint64_t n, uint64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

GgufValue U32(uint64_t v) { return GgufValue::Uint(GgufType::kUint32, v); }
GgufValue F32(double v) { return GgufValue::Float(GgufType::kFloat32, v); }

}  // namespace

// ---- GgufWriter
// ----------------------------------------------------------------------------------

void GgufWriter::Add(std::string key, GgufValue value) {
  metadata_.emplace_back(std::move(key), std::move(value));
}

void GgufWriter::AddTensor(std::string name, std::vector<int64_t> dims, uint32_t ggml_type,
                           Fill fill) {
  const DType dtype = DTypeFromGgmlType(ggml_type).value_or(DType::kF32);
  int64_t elements = 1;
  for (int64_t d : dims) elements *= d;
  const auto num_bytes = static_cast<uint64_t>(kernels::RowBytes(dtype, elements));
  tensors_.push_back({std::move(name), std::move(dims), ggml_type, num_bytes, std::move(fill)});
}

void GgufWriter::AddTensor(std::string name, std::vector<int64_t> dims, uint32_t ggml_type,
                           std::vector<std::byte> data) {
  AddTensor(std::move(name), std::move(dims), ggml_type,
            [data = std::move(data)](std::span<std::byte> out) {
              std::memcpy(out.data(), data.data(), std::min(out.size(), data.size()));
            });
}

void GgufWriter::Emit(const std::function<void(std::string_view)>& sink) const {
  std::string header;
  header.append("GGUF");
  AppendPod(&header, kGgufVersion);
  AppendPod<uint64_t>(&header, tensors_.size());
  AppendPod<uint64_t>(&header, metadata_.size());
  for (const auto& [key, value] : metadata_) {
    AppendString(&header, key);
    AppendPod(&header, static_cast<uint32_t>(value.type));
    AppendValue(&header, value);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    AppendString(&header, t.name);
    AppendPod(&header, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) AppendPod(&header, static_cast<uint64_t>(d));
    AppendPod(&header, t.ggml_type);
    AppendPod(&header, offset);
    offset = PadTo(offset + t.num_bytes, alignment_);
  }
  header.resize(PadTo(header.size(), alignment_), '\0');
  sink(header);
  std::vector<std::byte> buffer;
  for (const Tensor& t : tensors_) {
    buffer.assign(PadTo(t.num_bytes, alignment_), std::byte{0});
    t.fill(std::span<std::byte>(buffer.data(), t.num_bytes));
    sink(std::string_view(reinterpret_cast<const char*>(buffer.data()), buffer.size()));
  }
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::UnavailableError(StrCat(path, ": cannot open for writing"));
  Emit([&](std::string_view piece) {
    out.write(piece.data(), static_cast<std::streamsize>(piece.size()));
  });
  out.close();
  if (!out) return absl::UnavailableError(StrCat(path, ": write failed"));
  return absl::OkStatus();
}

std::string GgufWriter::Serialize() const {
  std::string out;
  Emit([&](std::string_view piece) { out.append(piece); });
  return out;
}

// ---- Checkpoint export
// ---------------------------------------------------------------------------

std::optional<GgufOutputType> GgufOutputTypeFromName(std::string_view name) {
  if (name == "f32") return GgufOutputType::kF32;
  if (name == "f16") return GgufOutputType::kF16;
  if (name == "q8_0") return GgufOutputType::kQ8_0;
  if (name == "q4_0") return GgufOutputType::kQ4_0;
  if (name == "q4_k") return GgufOutputType::kQ4_K;
  if (name == "q6_k") return GgufOutputType::kQ6_K;
  if (name == "q4_k_m") return GgufOutputType::kQ4_K_M;
  return std::nullopt;
}

void PermuteRotaryRows(std::span<float> values, int64_t rows, int64_t cols, int64_t num_heads,
                       bool inverse) {
  const int64_t head_dim = rows / num_heads;
  const int64_t half = head_dim / 2;
  std::vector<float> original(values.begin(), values.end());
  for (int64_t h = 0; h < num_heads; ++h) {
    for (int64_t s = 0; s < 2; ++s) {
      for (int64_t i = 0; i < half; ++i) {
        const int64_t split_row = h * head_dim + s * half + i;  // half-split layout
        const int64_t paired_row = h * head_dim + 2 * i + s;    // interleaved layout
        const int64_t from = inverse ? paired_row : split_row;
        const int64_t to = inverse ? split_row : paired_row;
        std::memcpy(&values[to * cols], &original[from * cols], cols * sizeof(float));
      }
    }
  }
}

absl::Status WriteGgufCheckpoint(const Checkpoint& checkpoint, GgufOutputType type,
                                 const std::string& path) {
  const ModelConfig& c = checkpoint.config();
  if (absl::Status s = ValidateModelConfig(c); !s.ok()) {
    return absl::Status(s.code(), StrCat(path, ": ", s.message()));
  }
  if (c.fp8.present) {  // its tensors mean something only with their scales
    return absl::UnimplementedError(StrCat(path, ": exporting an FP8 checkpoint (",
                                           c.fp8.method, " quantization) is not supported"));
  }
  const ModelFamily* family = FindFamily(c.family);
  if (family == nullptr || family->gguf_architecture.empty()) {
    return absl::UnimplementedError(StrCat(
        path, ": ", c.architecture_name,
        " models cannot be written as GGUF (supported: ", SupportedGgufArchitectures(), ")"));
  }
  const std::string& arch = family->gguf_architecture;
  const RopeLayout target_layout = family->gguf_rope_layout;

  GgufWriter writer(GgufFile::kDefaultAlignment);
  writer.Add("general.architecture", GgufValue::String(arch));
  writer.Add("general.name", GgufValue::String(c.name));
  writer.Add("general.alignment", U32(GgufFile::kDefaultAlignment));
  uint32_t file_type = kFileTypeMostlyQ8_0;
  switch (type) {
    case GgufOutputType::kF32:
      file_type = kFileTypeAllF32;
      break;
    case GgufOutputType::kF16:
      file_type = kFileTypeMostlyF16;
      break;
    case GgufOutputType::kQ8_0:
      break;
    case GgufOutputType::kQ4_0:
      file_type = kFileTypeMostlyQ4_0;
      break;
    case GgufOutputType::kQ4_K:
      file_type = kFileTypeMostlyQ4_KS;
      break;
    case GgufOutputType::kQ6_K:
      file_type = kFileTypeMostlyQ6_K;
      break;
    case GgufOutputType::kQ4_K_M:
      file_type = kFileTypeMostlyQ4_KM;
      break;
  }
  writer.Add("general.file_type", U32(file_type));
  writer.Add("general.quantization_version", U32(kQuantizationVersion));
  auto key = [&](std::string_view suffix) { return StrCat(arch, ".", suffix); };
  writer.Add(key("vocab_size"), U32(c.vocab_size));
  writer.Add(key("context_length"), U32(c.max_position_embeddings));
  writer.Add(key("embedding_length"), U32(c.hidden_size));
  writer.Add(key("feed_forward_length"), U32(c.intermediate_size));
  writer.Add(key("block_count"), U32(c.num_layers));
  writer.Add(key("rope.dimension_count"), U32(RotaryDim(c.rope, c.head_dim)));
  writer.Add(key("attention.head_count"), U32(c.num_attention_heads));
  writer.Add(key("attention.head_count_kv"), U32(c.num_kv_heads));
  writer.Add(key("attention.key_length"), U32(c.head_dim));
  writer.Add(key("attention.value_length"), U32(c.head_dim));
  writer.Add(key("rope.freq_base"), F32(c.rope.theta));
  writer.Add(key("attention.layer_norm_rms_epsilon"), F32(c.rms_norm_eps));
  if (c.sliding_window > 0) {
    writer.Add(key("attention.sliding_window"), U32(c.sliding_window));
    if (!c.sliding_layers.empty()) {
      std::vector<GgufValue> layers;
      for (bool sliding : c.sliding_layers) layers.push_back(GgufValue::Bool(sliding));
      writer.Add(key("attention.sliding_window_pattern"),
                 GgufValue::Array(GgufType::kBool, std::move(layers)));
    }
  }
  if (c.attn_logit_softcap > 0) {
    writer.Add(key("attn_logit_softcapping"), F32(c.attn_logit_softcap));
  }
  if (c.final_logit_softcap > 0) {
    writer.Add(key("final_logit_softcapping"), F32(c.final_logit_softcap));
  }
  if (c.query_pre_attn_scalar > 0) {
    writer.Add(key("attention.query_pre_attn_scalar"), F32(c.query_pre_attn_scalar));
  }
  if (c.local_rope.has_value()) {
    if (c.local_rope->scaling != RopeScaling::kDefault || !c.local_rope->freq_factors.empty()) {
      return absl::UnimplementedError(
          StrCat(path, ": a scaled rotary embedding of the local layers cannot be written"));
    }
    writer.Add(key("rope.freq_base_swa"), F32(c.local_rope->theta));
  }

  // Rotary scaling: explicit factors win (as in RopeInverseFrequencies), then llama3 as factors,
  // then linear as keys.
  std::vector<float> freq_factors = c.rope.freq_factors;
  if (freq_factors.empty() && c.rope.scaling == RopeScaling::kLlama3) {
    ModelConfig unscaled = c;
    unscaled.rope.scaling = RopeScaling::kDefault;
    const std::vector<double> base = RopeInverseFrequencies(unscaled.rope, unscaled.head_dim);
    const std::vector<double> scaled = RopeInverseFrequencies(c.rope, c.head_dim);
    for (size_t i = 0; i < base.size(); ++i) {
      freq_factors.push_back(static_cast<float>(base[i] / scaled[i]));
    }
  } else if (freq_factors.empty() && c.rope.scaling == RopeScaling::kLinear) {
    writer.Add(key("rope.scaling.type"), GgufValue::String("linear"));
    writer.Add(key("rope.scaling.factor"), F32(c.rope.factor));
  } else if (freq_factors.empty() && c.rope.scaling == RopeScaling::kLongRope) {
    // As llama.cpp's converter: the factors as tensors, the original context and the attention
    // factor as keys.
    writer.Add(key("rope.scaling.attn_factor"), F32(c.rope.attention_factor));
    writer.Add(key("rope.scaling.original_context_length"),
               U32(c.rope.original_max_position_embeddings));
    for (const auto& [name, factors] : {std::pair<const char*, const std::vector<float>*>{
                                            "rope_factors_long.weight", &c.rope.long_factors},
                                        {"rope_factors_short.weight", &c.rope.short_factors}}) {
      std::vector<std::byte> bytes(factors->size() * sizeof(float));
      std::memcpy(bytes.data(), factors->data(), bytes.size());
      writer.AddTensor(name, {static_cast<int64_t>(factors->size())},
                       GgmlTypeFromDType(DType::kF32), std::move(bytes));
    }
  }

  // Tokenizer: copied from a GGUF source; otherwise the ids the config knows.
  if (const GgufFile* source = checkpoint.gguf(); source != nullptr) {
    for (const auto& [k, v] : source->metadata()) {
      if (k.rfind("tokenizer.", 0) == 0) writer.Add(k, v);
    }
  } else {
    if (c.bos_token_id.has_value()) {
      writer.Add("tokenizer.ggml.bos_token_id", U32(static_cast<uint32_t>(*c.bos_token_id)));
    }
    if (!c.eos_token_ids.empty()) {
      writer.Add("tokenizer.ggml.eos_token_id", U32(static_cast<uint32_t>(c.eos_token_ids[0])));
    }
  }

  if (!freq_factors.empty()) {
    std::vector<std::byte> bytes(freq_factors.size() * sizeof(float));
    std::memcpy(bytes.data(), freq_factors.data(), bytes.size());
    writer.AddTensor("rope_freqs.weight", {static_cast<int64_t>(freq_factors.size())},
                     GgmlTypeFromDType(DType::kF32), std::move(bytes));
  }

  // Tensors: every checkpoint tensor the model's description reads, in llama.cpp's order: the
  // embeddings, each layer's tensors, then the final norm and the output. A mixture of experts
  // is its router (kept in F32, as llama.cpp's converter keeps it) and one 3-D tensor per
  // projection, the experts stacked outermost.
  absl::StatusOr<std::unique_ptr<ModelDescription>> model = DescribeModel(c);
  if (!model.ok()) return model.status();
  struct Entry {
    std::string gguf_name;
    std::vector<const TensorView*> parts;  // one, or each expert's
    float offset = 0;  // added to the values (Gemma's norms: GGUF stores the scale)
    bool keep_f32 = false;
  };
  std::vector<Entry> entries;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (c.num_experts > 0 && !IsMoeLayer(c, l)) {
      // llama.cpp's MoE architectures have experts in every layer.
      return absl::UnimplementedError(StrCat(path, ": layer ", l, " of ", c.architecture_name,
                                             " is dense; GGUF's ", arch,
                                             " architecture has experts in every layer"));
    }
  }
  enum Group { kEmbeddings, kLayers, kOutput };
  for (Group group : {kEmbeddings, kLayers, kOutput}) {
    for (const WeightSpec& spec : (*model)->weights().specs()) {
      const Group of = spec.layer >= 0               ? kLayers
                       : spec.kind == "embed_tokens" ? kEmbeddings
                                                     : kOutput;
      if (of != group) continue;
      std::vector<const TensorView*> parts;
      for (const WeightPart& part : spec.parts) {
        absl::StatusOr<const TensorView*> view = checkpoint.Get(part.name, spec.PartShape(part));
        if (!view.ok()) return view.status();
        parts.push_back(*view);
      }
      const std::string blk = StrCat("blk.", spec.layer, ".");
      if (spec.kind == "moe_router") {
        entries.push_back({StrCat(blk, "ffn_gate_inp.weight"), parts, 0, /*keep_f32=*/true});
      } else if (spec.kind == "moe_gate_up") {  // expert e's gate, then its up
        Entry gate{StrCat(blk, "ffn_gate_exps.weight"), {}};
        Entry up{StrCat(blk, "ffn_up_exps.weight"), {}};
        for (size_t i = 0; i < parts.size(); ++i)
          (i % 2 == 0 ? gate : up).parts.push_back(parts[i]);
        entries.push_back(std::move(gate));
        entries.push_back(std::move(up));
      } else if (spec.kind == "moe_down") {
        entries.push_back({StrCat(blk, "ffn_down_exps.weight"), parts, 0});
      } else {
        for (const TensorView* part : parts) {
          const std::optional<std::string> gguf_name = HfToGgufTensorName(family, part->name);
          if (!gguf_name.has_value()) {
            return absl::UnimplementedError(
                StrCat(path, ": tensor '", part->name, "' has no GGUF name for ", arch));
          }
          entries.push_back({*gguf_name, {part}, spec.offset});
        }
      }
    }
  }

  if (c.num_experts > 0) {
    writer.Add(key("expert_count"), U32(c.num_experts));
    writer.Add(key("expert_used_count"), U32(c.num_experts_per_tok));
    if (c.moe_intermediate_size != c.intermediate_size) {
      writer.Add(key("expert_feed_forward_length"), U32(c.moe_intermediate_size));
    }
    if (!c.norm_topk_prob) writer.Add(key("expert_weights_norm"), GgufValue::Bool(false));
  }

  for (const Entry& entry : entries) {
    const TensorView* view = entry.parts.front();
    for (const TensorView* part : entry.parts) {
      if (part->shape != view->shape) {
        return absl::InvalidArgumentError(StrCat(path, ": expert tensor '", part->name,
                                                 "' has shape ", part->ShapeString(),
                                                 ", unlike its layer's other experts"));
      }
    }
    if (view->shape.empty() || view->shape.size() > 2) {
      return absl::InvalidArgumentError(StrCat(path, ": tensor '", view->name, "' has shape ",
                                               view->ShapeString(), "; expected 1 or 2 dims"));
    }
    std::vector<int64_t> dims(view->shape.rbegin(), view->shape.rend());
    const int64_t cols = dims[0];
    const int64_t rows = dims.size() == 2 ? dims[1] : 1;
    const bool matrix = dims.size() == 2 && !entry.keep_f32;
    if (entry.parts.size() > 1) dims.push_back(static_cast<int64_t>(entry.parts.size()));
    DType out_dtype = DType::kF32;
    if (matrix && type == GgufOutputType::kF16) out_dtype = DType::kF16;
    if (matrix && type == GgufOutputType::kQ8_0) {
      out_dtype = cols % 32 == 0 ? DType::kQ8_0 : DType::kF16;
    }
    if (matrix && type == GgufOutputType::kQ4_0) {
      out_dtype = cols % 32 == 0 ? DType::kQ4_0 : DType::kF16;
    }
    if (matrix && (type == GgufOutputType::kQ4_K || type == GgufOutputType::kQ6_K ||
                   type == GgufOutputType::kQ4_K_M)) {
      // Rows that are not whole super-blocks fall back as llama.cpp's quantizer does: to Q8_0.
      const bool six_bits =
          type == GgufOutputType::kQ6_K ||
          (type == GgufOutputType::kQ4_K_M &&
           (view->name.ends_with("v_proj.weight") || view->name.ends_with("down_proj.weight")));
      const DType k_type = six_bits ? DType::kQ6_K : DType::kQ4_K;
      out_dtype = cols % 256 == 0 ? k_type : cols % 32 == 0 ? DType::kQ8_0 : DType::kF16;
    }
    // The number of heads whose rows to reorder, or 0.
    int64_t permute_heads = 0;
    if (c.rope.layout != target_layout) {
      if (view->name.ends_with("self_attn.q_proj.weight")) {
        permute_heads = c.num_attention_heads;
      } else if (view->name.ends_with("self_attn.k_proj.weight")) {
        permute_heads = c.num_kv_heads;
      } else if (view->name.ends_with("self_attn.q_proj.bias") ||
                 view->name.ends_with("self_attn.k_proj.bias")) {
        return absl::UnimplementedError(
            StrCat(path, ": tensor '", view->name, "': cannot change the rotary layout of biases"));
      }
    }
    const bool inverse = target_layout == RopeLayout::kHalfSplit;
    std::vector<TensorView> sources;
    for (const TensorView* part : entry.parts) sources.push_back(*part);
    const float offset = entry.offset;
    writer.AddTensor(
        entry.gguf_name, dims, GgmlTypeFromDType(out_dtype),
        [sources, offset, rows, cols, out_dtype, permute_heads, inverse](std::span<std::byte> out) {
          const int64_t part_elements = rows * cols;
          std::vector<float> values(static_cast<size_t>(part_elements * sources.size()));
          for (size_t i = 0; i < sources.size(); ++i) {
            kernels::DequantizeToF32(sources[i].dtype, sources[i].data,
                                     values.data() + i * part_elements, part_elements);
          }
          for (float& v : values) v += offset;
          if (permute_heads > 0) {
            PermuteRotaryRows(values, rows, cols, permute_heads, inverse);
          }
          switch (out_dtype) {
            case DType::kF32:
              std::memcpy(out.data(), values.data(), values.size() * sizeof(float));
              break;
            case DType::kF16:
              for (size_t i = 0; i < values.size(); ++i) {
                const uint16_t bits = kernels::F32ToF16(values[i]);
                std::memcpy(out.data() + 2 * i, &bits, 2);
              }
              break;
            case DType::kQ8_0:
            case DType::kQ4_0:
            case DType::kQ4_K:
            case DType::kQ6_K:
              kernels::QuantizeBlocks(out_dtype, values.data(), out.data(),
                                      static_cast<int64_t>(values.size()));
              break;
            default:
              break;
          }
        });
  }
  return writer.WriteFile(path);
}

}  // namespace lmserve::engine
