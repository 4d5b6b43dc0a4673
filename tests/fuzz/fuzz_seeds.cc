// fuzz_seeds OUT_DIR: writes small valid seed inputs for the fuzzers with the project's writers:
//   OUT_DIR/gguf_fuzz/        tiny llama (llama3 rope) and qwen2 models exported as Q8_0 and F16,
//                             a file with one tensor of every supported type, a file with metadata
//                             of every value type (nested arrays, alignment 64);
//   OUT_DIR/safetensors_fuzz/ the tiny models' safetensors and a file with F32/F16/BF16 tensors.
// The models are written as Hugging Face directories first and exported through the same code as
// `lmserve export-gguf`.

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/strings.h"
#include "engine/model/checkpoint.h"
#include "engine/model/gguf.h"
#include "engine/model/gguf_writer.h"
#include "engine/model/safetensors.h"
#include "kernels/cpu/half.h"

namespace lmserve::engine {
namespace {

namespace fs = std::filesystem;
using kernels::DType;

// Deterministic bf16 weights of a small magnitude.
std::vector<std::byte> Bf16Values(int64_t n, int seed) {
  std::vector<std::byte> out(n * 2);
  for (int64_t i = 0; i < n; ++i) {
    const float v = 0.02f * std::sin(static_cast<float>(i * 7 + seed * 13));
    const uint16_t bits = kernels::F32ToBf16(v);
    std::memcpy(out.data() + 2 * i, &bits, 2);
  }
  return out;
}

absl::Status WriteTinyHfModel(const fs::path& dir, bool qwen2) {
  fs::create_directories(dir);
  const int64_t vocab = 4, hidden = 32, ffn = 32, heads = 2, kv_heads = 1, head_dim = 16;
  std::ofstream(dir / "config.json") << StrCat(
      R"({"architectures": [")", qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM",
      R"("], "vocab_size": 4, "hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1,
      "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-5,
      "max_position_embeddings": 64, "hidden_act": "silu", "bos_token_id": 1,
      "eos_token_id": 2, "tie_word_embeddings": )",
      qwen2 ? "true" : "false",
      qwen2 ? "}"
            : R"(, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}})");
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"model.embed_tokens.weight", {vocab, hidden}},
      {"model.norm.weight", {hidden}},
      {"model.layers.0.input_layernorm.weight", {hidden}},
      {"model.layers.0.post_attention_layernorm.weight", {hidden}},
      {"model.layers.0.self_attn.q_proj.weight", {heads * head_dim, hidden}},
      {"model.layers.0.self_attn.k_proj.weight", {kv_heads * head_dim, hidden}},
      {"model.layers.0.self_attn.v_proj.weight", {kv_heads * head_dim, hidden}},
      {"model.layers.0.self_attn.o_proj.weight", {hidden, heads * head_dim}},
      {"model.layers.0.mlp.gate_proj.weight", {ffn, hidden}},
      {"model.layers.0.mlp.up_proj.weight", {ffn, hidden}},
      {"model.layers.0.mlp.down_proj.weight", {hidden, ffn}},
  };
  if (qwen2) {
    shapes.push_back({"model.layers.0.self_attn.q_proj.bias", {heads * head_dim}});
    shapes.push_back({"model.layers.0.self_attn.k_proj.bias", {kv_heads * head_dim}});
    shapes.push_back({"model.layers.0.self_attn.v_proj.bias", {kv_heads * head_dim}});
  } else {
    shapes.push_back({"lm_head.weight", {vocab, hidden}});
  }
  std::vector<std::vector<std::byte>> data;
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, shape] : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    data.push_back(Bf16Values(n, static_cast<int>(data.size())));
    tensors.push_back({name, DType::kBF16, shape, data.back()});
  }
  return WriteSafetensors((dir / "model.safetensors").string(), tensors);
}

// One tensor of every supported type, 256 elements each, with patterned bytes and sane scales.
absl::Status WriteEveryType(const fs::path& path) {
  GgufWriter writer;
  writer.Add("general.architecture", GgufValue::String("llama"));
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0,
                      DType::kQ4_1, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    std::vector<std::byte> bytes(kernels::RowBytes(dtype, 256));
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 37 + 11);
    if (kernels::IsQuantized(dtype)) {
      // Put fp16 1/64 wherever a block stores a scale (d, dmin / m); Q6_K keeps d last.
      const uint16_t scale = kernels::F32ToF16(1.0f / 64);
      const kernels::BlockLayout layout = kernels::GetBlockLayout(dtype);
      for (size_t b = 0; b < bytes.size(); b += layout.bytes_per_block) {
        const size_t d = dtype == DType::kQ6_K ? b + layout.bytes_per_block - 2 : b;
        std::memcpy(&bytes[d], &scale, 2);
        if (dtype == DType::kQ4_1 || dtype == DType::kQ4_K || dtype == DType::kQ5_K) {
          std::memcpy(&bytes[d + 2], &scale, 2);
        }
      }
    }
    writer.AddTensor(StrCat("t.", kernels::DTypeName(dtype)), {256}, GgmlTypeFromDType(dtype),
                     std::move(bytes));
  }
  return writer.WriteFile(path.string());
}

absl::Status WriteEveryValueType(const fs::path& path) {
  GgufWriter writer(64);
  writer.Add("general.alignment", GgufValue::Uint(GgufType::kUint32, 64));
  writer.Add("u8", GgufValue::Uint(GgufType::kUint8, 7));
  writer.Add("i8", GgufValue::Int(GgufType::kInt8, -7));
  writer.Add("u16", GgufValue::Uint(GgufType::kUint16, 700));
  writer.Add("i16", GgufValue::Int(GgufType::kInt16, -700));
  writer.Add("u32", GgufValue::Uint(GgufType::kUint32, 70000));
  writer.Add("i32", GgufValue::Int(GgufType::kInt32, -70000));
  writer.Add("u64", GgufValue::Uint(GgufType::kUint64, uint64_t{1} << 40));
  writer.Add("i64", GgufValue::Int(GgufType::kInt64, -(int64_t{1} << 40)));
  writer.Add("f32", GgufValue::Float(GgufType::kFloat32, 0.5));
  writer.Add("f64", GgufValue::Float(GgufType::kFloat64, 0.25));
  writer.Add("bool", GgufValue::Bool(true));
  writer.Add("tokenizer.ggml.model", GgufValue::String("gpt2"));
  writer.Add("tokenizer.ggml.tokens",
             GgufValue::Array(GgufType::kString, {GgufValue::String("a"), GgufValue::String("b")}));
  writer.Add("tokenizer.ggml.scores",
             GgufValue::Array(GgufType::kFloat32, {GgufValue::Float(GgufType::kFloat32, -1),
                                                   GgufValue::Float(GgufType::kFloat32, 1)}));
  writer.Add("tokenizer.ggml.token_type",
             GgufValue::Array(GgufType::kInt32, {GgufValue::Int(GgufType::kInt32, 1),
                                                 GgufValue::Int(GgufType::kInt32, 3)}));
  writer.Add("nested",
             GgufValue::Array(GgufType::kArray,
                              {GgufValue::Array(GgufType::kUint8,
                                                {GgufValue::Uint(GgufType::kUint8, 1)}),
                               GgufValue::Array(GgufType::kBool, {})}));
  writer.AddTensor("t", {4}, 0, std::vector<std::byte>(16));
  return writer.WriteFile(path.string());
}

absl::Status WriteSmallSafetensors(const fs::path& path) {
  std::vector<std::byte> f32(4 * 4), f16(3 * 2), bf16(2 * 2);
  for (size_t i = 0; i < f32.size(); ++i) f32[i] = std::byte(i * 29 + 3);
  return WriteSafetensors(path.string(), {{"a", DType::kF32, {2, 2}, f32},
                                          {"b", DType::kF16, {3}, f16},
                                          {"c", DType::kBF16, {1, 2}, bf16}});
}

int Main(const fs::path& out) {
  const fs::path gguf = out / "gguf_fuzz", safetensors = out / "safetensors_fuzz";
  const fs::path scratch = out / "scratch";
  fs::create_directories(gguf);
  fs::create_directories(safetensors);
  std::vector<absl::Status> results;
  for (bool qwen2 : {false, true}) {
    const std::string name = qwen2 ? "tiny-qwen2" : "tiny-llama3";
    const fs::path dir = scratch / name;
    results.push_back(WriteTinyHfModel(dir, qwen2));
    if (!results.back().ok()) break;
    std::error_code ec;
    fs::copy_file(dir / "model.safetensors", safetensors / (name + ".safetensors"),
                  fs::copy_options::overwrite_existing, ec);
    absl::StatusOr<std::unique_ptr<Checkpoint>> checkpoint = OpenCheckpoint(dir.string());
    if (!checkpoint.ok()) {
      results.push_back(checkpoint.status());
      break;
    }
    results.push_back(WriteGgufCheckpoint(**checkpoint, qwen2 ? GgufOutputType::kF16
                                                              : GgufOutputType::kQ8_0,
                                          (gguf / (name + ".gguf")).string()));
  }
  results.push_back(WriteEveryType(gguf / "every-type.gguf"));
  results.push_back(WriteEveryValueType(gguf / "every-value-type.gguf"));
  results.push_back(WriteSmallSafetensors(safetensors / "small.safetensors"));
  std::error_code ec;
  fs::remove_all(scratch, ec);
  for (const absl::Status& s : results) {
    if (!s.ok()) {
      std::fprintf(stderr, "fuzz_seeds: %s\n", std::string(s.message()).c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace lmserve::engine

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds OUT_DIR\n");
    return 2;
  }
  return lmserve::engine::Main(argv[1]);
}
