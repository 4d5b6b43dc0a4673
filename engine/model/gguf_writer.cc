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
constexpr uint32_t kFileTypeMostlyQ8_0 = 7;

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
  const ModelFamily* family = FindFamily(c.family);
  if (family == nullptr || family->gguf_architecture.empty()) {
    return absl::UnimplementedError(StrCat(path, ": ", c.architecture_name,
                                           " models cannot be written as GGUF (supported: ",
                                           SupportedGgufArchitectures(), ")"));
  }
  const std::string& arch = family->gguf_architecture;
  const RopeLayout target_layout = family->gguf_rope_layout;

  GgufWriter writer(GgufFile::kDefaultAlignment);
  writer.Add("general.architecture", GgufValue::String(arch));
  writer.Add("general.name", GgufValue::String(c.name));
  writer.Add("general.alignment", U32(GgufFile::kDefaultAlignment));
  writer.Add("general.file_type", U32(type == GgufOutputType::kF32   ? kFileTypeAllF32
                                      : type == GgufOutputType::kF16 ? kFileTypeMostlyF16
                                                                     : kFileTypeMostlyQ8_0));
  writer.Add("general.quantization_version", U32(kQuantizationVersion));
  auto key = [&](std::string_view suffix) { return StrCat(arch, ".", suffix); };
  writer.Add(key("vocab_size"), U32(c.vocab_size));
  writer.Add(key("context_length"), U32(c.max_position_embeddings));
  writer.Add(key("embedding_length"), U32(c.hidden_size));
  writer.Add(key("feed_forward_length"), U32(c.intermediate_size));
  writer.Add(key("block_count"), U32(c.num_layers));
  writer.Add(key("rope.dimension_count"), U32(c.head_dim));
  writer.Add(key("attention.head_count"), U32(c.num_attention_heads));
  writer.Add(key("attention.head_count_kv"), U32(c.num_kv_heads));
  writer.Add(key("attention.key_length"), U32(c.head_dim));
  writer.Add(key("attention.value_length"), U32(c.head_dim));
  writer.Add(key("rope.freq_base"), F32(c.rope.theta));
  writer.Add(key("attention.layer_norm_rms_epsilon"), F32(c.rms_norm_eps));

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

  // Tensors in llama.cpp's order: embeddings, each layer, the final norm and the output. A
  // mixture of experts is its router (kept in F32, as llama.cpp's converter keeps it) and one 3-D
  // tensor per projection, the experts stacked outermost.
  struct Entry {
    std::string gguf_name;
    std::vector<const TensorView*> parts;  // one, or each expert's
    bool keep_f32 = false;
  };
  std::vector<Entry> entries;
  auto add_view = [&](const std::string& name) {
    auto it = checkpoint.tensors().find(name);
    if (it == checkpoint.tensors().end()) return;
    const std::optional<std::string> gguf_name = HfToGgufTensorName(name);
    if (gguf_name.has_value()) entries.push_back({*gguf_name, {&it->second}});
  };
  if (c.num_experts > 0 && !family->moe_names.has_value()) {
    return absl::UnimplementedError(
        StrCat(path, ": experts of ", c.architecture_name, " models cannot be written as GGUF"));
  }
  add_view("model.embed_tokens.weight");
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (std::string_view suffix :
         {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.q_proj.bias",
          "self_attn.k_proj.weight", "self_attn.k_proj.bias", "self_attn.v_proj.weight",
          "self_attn.v_proj.bias", "self_attn.o_proj.weight", "self_attn.o_proj.bias",
          "post_attention_layernorm.weight"}) {
      add_view(LayerTensorName(l, suffix));
    }
    if (!IsMoeLayer(c, l)) {
      if (c.num_experts > 0) {
        // llama.cpp's MoE architectures have experts in every layer.
        return absl::UnimplementedError(StrCat(path, ": layer ", l, " of ", c.architecture_name,
                                               " is dense; GGUF's ", arch,
                                               " architecture has experts in every layer"));
      }
      for (std::string_view suffix :
           {"mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}) {
        add_view(LayerTensorName(l, suffix));
      }
      continue;
    }
    const MoeTensorNames& names = *family->moe_names;
    const std::string router = LayerTensorName(l, names.router);
    LMSERVE_ASSIGN_OR_RETURN(const TensorView* router_view, checkpoint.Find(router));
    entries.push_back({StrCat("blk.", l, ".ffn_gate_inp.weight"), {router_view}, true});
    for (const auto& [gguf, projection] :
         {std::pair<std::string_view, const std::string*>{"ffn_gate_exps.weight", &names.gate},
          {"ffn_down_exps.weight", &names.down},
          {"ffn_up_exps.weight", &names.up}}) {
      Entry entry{StrCat("blk.", l, ".", gguf), {}};
      for (int64_t e = 0; e < c.num_experts; ++e) {
        LMSERVE_ASSIGN_OR_RETURN(const TensorView* view,
                                 checkpoint.Find(names.Expert(l, e, *projection)));
        entry.parts.push_back(view);
      }
      for (const TensorView* view : entry.parts) {
        if (view->shape.size() != 2 || view->shape != entry.parts.front()->shape) {
          return absl::InvalidArgumentError(StrCat(path, ": expert tensor '", view->name,
                                                   "' has shape ", view->ShapeString(),
                                                   ", unlike its layer's other experts"));
        }
      }
      entries.push_back(std::move(entry));
    }
  }
  add_view("model.norm.weight");
  if (!c.tie_word_embeddings) add_view("lm_head.weight");

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
    writer.AddTensor(
        entry.gguf_name, dims, GgmlTypeFromDType(out_dtype),
        [sources, rows, cols, out_dtype, permute_heads, inverse](std::span<std::byte> out) {
          const int64_t part_elements = rows * cols;
          std::vector<float> values(static_cast<size_t>(part_elements * sources.size()));
          for (size_t i = 0; i < sources.size(); ++i) {
            kernels::DequantizeToF32(sources[i].dtype, sources[i].data,
                                     values.data() + i * part_elements, part_elements);
          }
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
              kernels::QuantizeQ8_0(values.data(), out.data(),
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
