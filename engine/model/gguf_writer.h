// Writing GGUF v3 files: a low-level writer (metadata and tensors as given), and the export of a
// whole Checkpoint the way llama.cpp's convert_hf_to_gguf.py writes a Hugging Face model.

#ifndef LMSERVE_ENGINE_MODEL_GGUF_WRITER_H_
#define LMSERVE_ENGINE_MODEL_GGUF_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/checkpoint.h"
#include "engine/model/gguf.h"

namespace lmserve::engine {

class GgufWriter {
 public:
  // `alignment` pads the data section and every tensor; a value other than 32 must also be
  // written as the metadata key general.alignment (u32) by the caller.
  explicit GgufWriter(uint32_t alignment = GgufFile::kDefaultAlignment) : alignment_(alignment) {}

  // Metadata, written in the order added.
  void Add(std::string key, GgufValue value);

  // Writes a tensor's bytes into `out` (exactly its size in bytes).
  using Fill = std::function<void(std::span<std::byte> out)>;

  // A tensor of `dims` (GGUF order: dims[0] innermost) and ggml type `ggml_type`, filled when the
  // file is written, so that only one tensor at a time is held in memory.
  // REQUIRES: ggml_type is supported (DTypeFromGgmlType) and dims[0] a multiple of its block size.
  void AddTensor(std::string name, std::vector<int64_t> dims, uint32_t ggml_type, Fill fill);
  // As above, with the bytes given. REQUIRES: data.size() is the tensor's size in bytes.
  void AddTensor(std::string name, std::vector<int64_t> dims, uint32_t ggml_type,
                 std::vector<std::byte> data);

  // Writes the file. Errors name the path.
  absl::Status WriteFile(const std::string& path) const;
  // The whole file in memory (tests, fuzzing seeds).
  std::string Serialize() const;

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> dims;
    uint32_t ggml_type;
    uint64_t num_bytes;
    Fill fill;
  };
  // Calls `sink` with consecutive pieces of the file.
  void Emit(const std::function<void(std::string_view)>& sink) const;

  uint32_t alignment_;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::vector<Tensor> tensors_;
};

// The tensor types of `lmserve export-gguf --type`.
// Q4_0, Q4_K and Q6_K are written by plain quantizers (kernels/cpu/dequant.h: valid blocks of
// about llama.cpp's error, not its searched scales), for tests and experiments. kQ4_K_M mixes
// them as llama.cpp's Q4_K_M does, simplified: the v and down projections in Q6_K (llama.cpp:
// in some layers), every other matrix in Q4_K.
enum class GgufOutputType { kF32, kF16, kQ8_0, kQ4_0, kQ4_K, kQ6_K, kQ4_K_M };
// f32, f16, q8_0, q4_0, q4_k, q6_k, q4_k_m
std::optional<GgufOutputType> GgufOutputTypeFromName(std::string_view name);

// Writes `checkpoint` as GGUF v3, as convert_hf_to_gguf.py would:
// - metadata general.architecture (llama for Llama and Mistral, qwen2), general.name,
//   general.alignment (32), general.file_type, {arch}.* hyper-parameters; tokenizer.* keys copied
//   through from a GGUF source, otherwise the bos/eos ids of the config;
// - tensors under llama.cpp's names; matrices in `type` (Q8_0 and Q4_0 fall back to F16 for rows
//   that are not a multiple of 32; Q4_K and Q6_K to Q8_0 for rows that are not whole super-blocks
//   of 256, then F16), 1-D tensors (norms, biases) always F32;
// - for the llama architecture, the Q/K rows permuted for llama.cpp's interleaved rotary
//   (LlamaModel.permute), unless the source already has that layout;
// - llama3 rope scaling as a rope_freqs.weight tensor (F32, head_dim / 2 divisors of the
//   unscaled inverse frequencies), linear scaling as rope.scaling.type/factor.
// Errors name the path (and the tensor).
absl::Status WriteGgufCheckpoint(const Checkpoint& checkpoint, GgufOutputType type,
                                 const std::string& path);

// LlamaModel.permute of convert_hf_to_gguf.py on the rows of a [rows, cols] row-major matrix:
// within each of the `num_heads` heads, row s * (head_dim / 2) + i moves to row 2 * i + s
// (half-split rotary pairs become adjacent). `inverse` undoes it.
// REQUIRES: rows is a multiple of 2 * num_heads; values.size() == rows * cols.
void PermuteRotaryRows(std::span<float> values, int64_t rows, int64_t cols, int64_t num_heads,
                       bool inverse);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_MODEL_GGUF_WRITER_H_
