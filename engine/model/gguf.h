// GGUF files (llama.cpp's model format, versions 2 and 3), read through a memory mapping.
//
// Layout (little-endian): "GGUF", u32 version, u64 tensor_count, u64 kv_count; kv_count key/value
// pairs (key: u64 length + bytes; u32 value type; value); tensor_count tensor infos (name; u32
// n_dims; u64 ne[n_dims], ne[0] innermost; u32 ggml type; u64 offset); padding to
// `general.alignment` (default 32); the data section, each tensor at its offset from the section's
// start.
//
// Parsing validates every length, count and offset against the file size before it reads or
// allocates: no input, however corrupt, reads past the end of the mapping, and counts that cannot
// fit in the bytes left are rejected before anything is allocated (parsed metadata takes at most
// about 100 bytes of memory per byte of file). Errors name the file, and the key or tensor at
// fault.

#ifndef LMSERVE_ENGINE_MODEL_GGUF_H_
#define LMSERVE_ENGINE_MODEL_GGUF_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/checkpoint.h"
#include "engine/model/mapped_file.h"
#include "kernels/dtype.h"

namespace lmserve::engine {

// The value types of GGUF metadata, with their ids in the file.
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

std::string_view GgufTypeName(GgufType type);  // "u32", "string", "array", ...

// One metadata value: a scalar, a string, or an array of values of one type (arrays may nest).
struct GgufValue {
  GgufType type = GgufType::kUint8;
  GgufType element_type = GgufType::kUint8;  // kArray only
  int64_t int_value = 0;                     // kInt8..kInt64, and kBool (0 or 1)
  uint64_t uint_value = 0;                   // kUint8..kUint64
  double float_value = 0;                    // kFloat32 (exactly), kFloat64
  std::string string_value;                  // kString: the bytes as stored (normally UTF-8)
  std::vector<GgufValue> elements;           // kArray

  static GgufValue Int(GgufType type, int64_t value);    // a signed integer type
  static GgufValue Uint(GgufType type, uint64_t value);  // an unsigned integer type
  static GgufValue Float(GgufType type, double value);   // kFloat32 or kFloat64
  static GgufValue Bool(bool value);
  static GgufValue String(std::string value);
  static GgufValue Array(GgufType element_type, std::vector<GgufValue> elements);

  bool IsInteger() const;
  // The value of an integer of any width and signedness; nullopt for other types and for a u64
  // above INT64_MAX.
  std::optional<int64_t> AsInt() const;
  // kFloat32 / kFloat64; nullopt for other types.
  std::optional<double> AsFloat() const;
  // A readable rendering for `lmserve info`: strings quoted, arrays cut after `max_elements`.
  std::string ToString(size_t max_elements = 8) const;
};

// A tensor as the file describes it.
struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // GGUF order: dims[0] is the innermost (contiguous) dimension
  uint32_t ggml_type = 0;
  kernels::DType dtype = kernels::DType::kF32;
  uint64_t offset = 0;              // from the start of the data section; a multiple of alignment
  const std::byte* data = nullptr;  // into the mapping
  int64_t num_bytes = 0;

  int64_t NumElements() const;
};

// The name of a ggml type id ("Q4_K", "IQ2_XXS"), or "unknown".
std::string_view GgmlTypeName(uint32_t ggml_type);
// The DType of a supported ggml type id (F32=0, F16=1, Q4_0=2, Q4_1=3, Q8_0=8, Q4_K=12, Q5_K=13,
// Q6_K=14, BF16=30); nullopt otherwise.
std::optional<kernels::DType> DTypeFromGgmlType(uint32_t ggml_type);
uint32_t GgmlTypeFromDType(kernels::DType dtype);

class GgufFile {
 public:
  static constexpr uint32_t kDefaultAlignment = 32;

  // Maps and parses `path`.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses a mapped (or in-memory) file. InvalidArgument for a malformed file, Unimplemented for
  // a tensor type outside DType; every message starts with the file's path.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Parse(std::unique_ptr<MappedFile> file);

  const std::string& path() const { return file_->path(); }
  const MappedFile& file() const { return *file_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // where the data section starts

  // Every key/value pair, in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  const GgufValue* Find(std::string_view key) const;  // nullptr when absent

  // Typed getters: nullopt when the key is absent or holds another type.
  std::optional<std::string> GetString(std::string_view key) const;
  std::optional<int64_t> GetInt(std::string_view key) const;   // any integer type that fits
  std::optional<double> GetFloat(std::string_view key) const;  // f32 or f64
  std::optional<bool> GetBool(std::string_view key) const;
  std::optional<std::vector<std::string>> GetStringArray(std::string_view key) const;
  std::optional<std::vector<int64_t>> GetIntArray(std::string_view key) const;   // any int type
  std::optional<std::vector<bool>> GetBoolArray(std::string_view key) const;
  std::optional<std::vector<double>> GetFloatArray(std::string_view key) const;  // f32 or f64

  // Tensors in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(std::string_view name) const;  // nullptr when absent

 private:
  explicit GgufFile(std::unique_ptr<MappedFile> file) : file_(std::move(file)) {}

  std::unique_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::map<std::string, size_t, std::less<>> metadata_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

struct ModelFamily;

// Tensor names: llama.cpp's ("blk.3.attn_q.weight") and Hugging Face's
// ("model.layers.3.self_attn.q_proj.weight"), for `family` (its own names first; null: the names
// every family shares); nullopt for names the decoder does not read.
std::optional<std::string> GgufToHfTensorName(const ModelFamily* family,
                                              std::string_view gguf_name);
std::optional<std::string> HfToGgufTensorName(const ModelFamily* family,
                                              std::string_view hf_name);

// Builds a checkpoint from a parsed GGUF file (OpenGgufCheckpoint maps the file and calls this).
// The checkpoint owns `file`; tensor views point into its mapping.
absl::StatusOr<std::unique_ptr<Checkpoint>> GgufCheckpointFromFile(std::unique_ptr<GgufFile> file);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_MODEL_GGUF_H_
