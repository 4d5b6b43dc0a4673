#include "engine/model/gguf.h"

#include <array>
#include <cstring>
#include <limits>

#include "common/status.h"
#include "absl/status/status.h"
#include "common/strings.h"

namespace lmserve::engine {
namespace {

using kernels::DType;

constexpr int kMaxDims = 4;                  // GGML_MAX_DIMS
constexpr int kMaxArrayNesting = 8;          // arrays of arrays of ...: deeper is rejected
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;  // empty key, type, a 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // empty name, n_dims 0, type, offset

// Names of every ggml type id, supported or not, for error messages (ggml.h's enum ggml_type).
// clang-format off
constexpr std::array<std::string_view, 40> kGgmlTypeNames = {
    "F32", "F16", "Q4_0", "Q4_1", "Q4_2 (removed)", "Q4_3 (removed)", "Q5_0", "Q5_1",   //  0..7
    "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K",                     //  8..15
    "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",      // 16..23
    "I8", "I16", "I32", "I64", "F64", "IQ1_M", "BF16", "Q4_0_4_4",                      // 24..31
    "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", // 32..38
    "MXFP4",                                                                            // 39
};
// clang-format on

struct SupportedType {
  uint32_t ggml_type;
  DType dtype;
};
constexpr SupportedType kSupportedTypes[] = {
    {0, DType::kF32},   {1, DType::kF16},   {30, DType::kBF16},
    {8, DType::kQ8_0},  {2, DType::kQ4_0},  {3, DType::kQ4_1},
    {12, DType::kQ4_K}, {13, DType::kQ5_K}, {14, DType::kQ6_K},
};
constexpr std::string_view kSupportedTypeList =
    "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K";

// Size in bytes of a fixed-size value type; 0 for string and array.
uint64_t FixedSize(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kInt8:
    case GgufType::kBool:
      return 1;
    case GgufType::kUint16:
    case GgufType::kInt16:
      return 2;
    case GgufType::kUint32:
    case GgufType::kInt32:
    case GgufType::kFloat32:
      return 4;
    case GgufType::kUint64:
    case GgufType::kInt64:
    case GgufType::kFloat64:
      return 8;
    case GgufType::kString:
    case GgufType::kArray:
      return 0;
  }
  return 0;
}

bool IsKnownType(uint32_t type) { return type <= static_cast<uint32_t>(GgufType::kFloat64); }

// Bounds-checked little-endian reads over the mapping. Every read checks the bytes left first.
class Reader {
 public:
  Reader(const std::byte* data, uint64_t size) : data_(data), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }
  uint64_t size() const { return size_; }

  template <typename T>
  bool Read(T* out) {
    if (remaining() < sizeof(T)) return false;
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // REQUIRES: length <= remaining().
  std::string TakeString(uint64_t length) {
    std::string out(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(length));
    pos_ += length;
    return out;
  }

 private:
  const std::byte* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

class Parser {
 public:
  Parser(const std::string& path, const std::byte* data, uint64_t size)
      : path_(path), reader_(data, size) {}

  absl::Status Corrupt(std::string_view what) const {
    return absl::InvalidArgumentError(StrCat(path_, ": corrupt GGUF file: ", what));
  }
  absl::Status Truncated(std::string_view what) const {
    return Corrupt(StrCat("truncated: ", what, " at byte ", reader_.pos(), " runs past the end (",
                          reader_.size(), " bytes)"));
  }

  template <typename T>
  absl::Status Read(T* out, std::string_view what) {
    if (!reader_.Read(out)) return Truncated(what);
    return absl::OkStatus();
  }

  // A GGUF string: u64 length, then the bytes.
  absl::Status ReadString(std::string* out, std::string_view what) {
    uint64_t length = 0;
    LMSERVE_RETURN_IF_ERROR(Read(&length, StrCat(what, " (string length)")));
    if (length > reader_.remaining()) {
      return Corrupt(StrCat(what, " has string length ", length, " at byte ", reader_.pos() - 8,
                            ", more than the ", reader_.remaining(), " bytes left in the file"));
    }
    *out = reader_.TakeString(length);
    return absl::OkStatus();
  }

  // A value of type `type`; `what` names it in errors ("key 'general.name'").
  absl::Status ReadValue(GgufType type, int depth, std::string_view what, GgufValue* out) {
    out->type = type;
    switch (type) {
      case GgufType::kUint8:
        return ReadUint<uint8_t>(what, out);
      case GgufType::kUint16:
        return ReadUint<uint16_t>(what, out);
      case GgufType::kUint32:
        return ReadUint<uint32_t>(what, out);
      case GgufType::kUint64:
        return ReadUint<uint64_t>(what, out);
      case GgufType::kInt8:
        return ReadInt<int8_t>(what, out);
      case GgufType::kInt16:
        return ReadInt<int16_t>(what, out);
      case GgufType::kInt32:
        return ReadInt<int32_t>(what, out);
      case GgufType::kInt64:
        return ReadInt<int64_t>(what, out);
      case GgufType::kFloat32: {
        float v = 0;
        LMSERVE_RETURN_IF_ERROR(Read(&v, what));
        out->float_value = v;
        return absl::OkStatus();
      }
      case GgufType::kFloat64:
        return Read(&out->float_value, what);
      case GgufType::kBool: {
        uint8_t v = 0;
        LMSERVE_RETURN_IF_ERROR(Read(&v, what));
        if (v > 1) return Corrupt(StrCat(what, " is a bool with byte value ", int{v}));
        out->int_value = v;
        return absl::OkStatus();
      }
      case GgufType::kString:
        return ReadString(&out->string_value, what);
      case GgufType::kArray:
        return ReadArray(depth, what, out);
    }
    return Corrupt(StrCat(what, " has an unknown type"));
  }

  absl::Status ReadArray(int depth, std::string_view what, GgufValue* out) {
    uint32_t element_type = 0;
    uint64_t count = 0;
    LMSERVE_RETURN_IF_ERROR(Read(&element_type, StrCat(what, " (array type)")));
    if (!IsKnownType(element_type)) {
      return Corrupt(StrCat(what, " is an array of unknown value type ", element_type));
    }
    out->element_type = static_cast<GgufType>(element_type);
    if (out->element_type == GgufType::kArray && depth + 1 >= kMaxArrayNesting) {
      return Corrupt(StrCat(what, " nests arrays deeper than ", kMaxArrayNesting, " levels"));
    }
    LMSERVE_RETURN_IF_ERROR(Read(&count, StrCat(what, " (array length)")));
    // Every element needs at least this many bytes: a count that cannot fit is rejected before
    // anything is allocated.
    uint64_t min_bytes = FixedSize(out->element_type);
    if (out->element_type == GgufType::kString) min_bytes = 8;
    if (out->element_type == GgufType::kArray) min_bytes = 4 + 8;
    if (count > reader_.remaining() / min_bytes) {
      return Corrupt(StrCat(what, " has array length ", count, " at byte ", reader_.pos() - 8, ": ",
                            count, " elements of type ", GgufTypeName(out->element_type),
                            " do not fit in the ", reader_.remaining(), " bytes left in the file"));
    }
    out->elements.resize(static_cast<size_t>(count));
    for (uint64_t i = 0; i < count; ++i) {
      LMSERVE_RETURN_IF_ERROR(ReadValue(out->element_type, depth + 1, what, &out->elements[i]));
    }
    return absl::OkStatus();
  }

  Reader& reader() { return reader_; }

 private:
  template <typename T>
  absl::Status ReadUint(std::string_view what, GgufValue* out) {
    T v = 0;
    LMSERVE_RETURN_IF_ERROR(Read(&v, what));
    out->uint_value = v;
    return absl::OkStatus();
  }
  template <typename T>
  absl::Status ReadInt(std::string_view what, GgufValue* out) {
    T v = 0;
    LMSERVE_RETURN_IF_ERROR(Read(&v, what));
    out->int_value = v;
    return absl::OkStatus();
  }

  const std::string& path_;
  Reader reader_;
};

std::string Quote(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out.append("\\n");
    } else if (u < 0x20 || u == 0x7F) {
      constexpr char kHex[] = "0123456789abcdef";
      out.append("\\x");
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 15]);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace

std::string_view GgufTypeName(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
      return "u8";
    case GgufType::kInt8:
      return "i8";
    case GgufType::kUint16:
      return "u16";
    case GgufType::kInt16:
      return "i16";
    case GgufType::kUint32:
      return "u32";
    case GgufType::kInt32:
      return "i32";
    case GgufType::kFloat32:
      return "f32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kUint64:
      return "u64";
    case GgufType::kInt64:
      return "i64";
    case GgufType::kFloat64:
      return "f64";
  }
  return "unknown";
}

std::string_view GgmlTypeName(uint32_t ggml_type) {
  return ggml_type < kGgmlTypeNames.size() ? kGgmlTypeNames[ggml_type] : "unknown";
}

std::optional<DType> DTypeFromGgmlType(uint32_t ggml_type) {
  for (const SupportedType& t : kSupportedTypes) {
    if (t.ggml_type == ggml_type) return t.dtype;
  }
  return std::nullopt;
}

uint32_t GgmlTypeFromDType(DType dtype) {
  for (const SupportedType& t : kSupportedTypes) {
    if (t.dtype == dtype) return t.ggml_type;
  }
  return 0;  // unreachable: every DType is supported
}

// ---- GgufValue
// -----------------------------------------------------------------------------------

GgufValue GgufValue::Int(GgufType type, int64_t value) {
  GgufValue v;
  v.type = type;
  v.int_value = value;
  return v;
}

GgufValue GgufValue::Uint(GgufType type, uint64_t value) {
  GgufValue v;
  v.type = type;
  v.uint_value = value;
  return v;
}

GgufValue GgufValue::Float(GgufType type, double value) {
  GgufValue v;
  v.type = type;
  v.float_value = type == GgufType::kFloat32 ? static_cast<float>(value) : value;
  return v;
}

GgufValue GgufValue::Bool(bool value) {
  GgufValue v;
  v.type = GgufType::kBool;
  v.int_value = value ? 1 : 0;
  return v;
}

GgufValue GgufValue::String(std::string value) {
  GgufValue v;
  v.type = GgufType::kString;
  v.string_value = std::move(value);
  return v;
}

GgufValue GgufValue::Array(GgufType element_type, std::vector<GgufValue> elements) {
  GgufValue v;
  v.type = GgufType::kArray;
  v.element_type = element_type;
  v.elements = std::move(elements);
  return v;
}

bool GgufValue::IsInteger() const {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kUint16:
    case GgufType::kUint32:
    case GgufType::kUint64:
    case GgufType::kInt8:
    case GgufType::kInt16:
    case GgufType::kInt32:
    case GgufType::kInt64:
      return true;
    default:
      return false;
  }
}

std::optional<int64_t> GgufValue::AsInt() const {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kUint16:
    case GgufType::kUint32:
    case GgufType::kUint64:
      if (uint_value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return std::nullopt;
      }
      return static_cast<int64_t>(uint_value);
    case GgufType::kInt8:
    case GgufType::kInt16:
    case GgufType::kInt32:
    case GgufType::kInt64:
      return int_value;
    default:
      return std::nullopt;
  }
}

std::optional<double> GgufValue::AsFloat() const {
  if (type == GgufType::kFloat32 || type == GgufType::kFloat64) return float_value;
  return std::nullopt;
}

std::string GgufValue::ToString(size_t max_elements) const {
  switch (type) {
    case GgufType::kUint8:
    case GgufType::kUint16:
    case GgufType::kUint32:
    case GgufType::kUint64:
      return StrCat(uint_value);
    case GgufType::kInt8:
    case GgufType::kInt16:
    case GgufType::kInt32:
    case GgufType::kInt64:
      return StrCat(int_value);
    case GgufType::kFloat32:
      return StrCat(static_cast<float>(float_value));
    case GgufType::kFloat64:
      return StrCat(float_value);
    case GgufType::kBool:
      return int_value != 0 ? "true" : "false";
    case GgufType::kString:
      return Quote(string_value);
    case GgufType::kArray: {
      std::string out = "[";
      for (size_t i = 0; i < elements.size() && i < max_elements; ++i) {
        if (i > 0) out.append(", ");
        out.append(elements[i].ToString(max_elements));
      }
      if (elements.size() > max_elements) {
        out.append(StrCat(", ... (", elements.size(), " ", GgufTypeName(element_type), ")"));
      }
      out.push_back(']');
      return out;
    }
  }
  return "?";
}

int64_t GgufTensorInfo::NumElements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// ---- GgufFile
// ------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  absl::StatusOr<std::unique_ptr<MappedFile>> file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  return Parse(*std::move(file));
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(std::unique_ptr<MappedFile> mapped) {
  const std::string path = mapped->path();
  const std::byte* base = mapped->data();
  const uint64_t size = mapped->size();
  auto file = std::unique_ptr<GgufFile>(new GgufFile(std::move(mapped)));
  Parser parser(path, base, size);

  // Header.
  if (size < 4 || std::memcmp(base, "GGUF", 4) != 0) {
    return absl::InvalidArgumentError(
        StrCat(path, ": not a GGUF file (the first 4 bytes are not \"GGUF\")"));
  }
  uint32_t magic = 0;
  (void)parser.Read(&magic, "magic");
  LMSERVE_RETURN_IF_ERROR(parser.Read(&file->version_, "the version"));
  if (file->version_ == 1) {
    return absl::UnimplementedError(
        StrCat(path, ": GGUF version 1 is not supported (versions 2 and 3 are)"));
  }
  if (file->version_ != 2 && file->version_ != 3) {
    return absl::InvalidArgumentError(StrCat(
        path, ": GGUF version ", file->version_,
        " is not supported (versions 2 and 3 are; a big-endian file reads as a huge version)"));
  }
  uint64_t tensor_count = 0, kv_count = 0;
  LMSERVE_RETURN_IF_ERROR(parser.Read(&tensor_count, "the tensor count"));
  LMSERVE_RETURN_IF_ERROR(parser.Read(&kv_count, "the metadata count"));
  const uint64_t left = parser.reader().remaining();
  if (kv_count > left / kMinKvBytes) {
    return parser.Corrupt(
        StrCat("metadata count ", kv_count, " cannot fit in the ", left, " bytes left"));
  }
  if (tensor_count > left / kMinTensorInfoBytes) {
    return parser.Corrupt(
        StrCat("tensor count ", tensor_count, " cannot fit in the ", left, " bytes left"));
  }

  // Metadata.
  file->metadata_.reserve(static_cast<size_t>(kv_count));
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key;
    LMSERVE_RETURN_IF_ERROR(parser.ReadString(&key, StrCat("metadata key #", i)));
    const std::string what = StrCat("key '", key, "'");
    uint32_t type = 0;
    LMSERVE_RETURN_IF_ERROR(parser.Read(&type, StrCat(what, " (value type)")));
    if (!IsKnownType(type)) return parser.Corrupt(StrCat(what, " has unknown value type ", type));
    GgufValue value;
    LMSERVE_RETURN_IF_ERROR(parser.ReadValue(static_cast<GgufType>(type), 0, what, &value));
    if (!file->metadata_index_.emplace(key, file->metadata_.size()).second) {
      return parser.Corrupt(StrCat(what, " appears twice"));
    }
    file->metadata_.emplace_back(std::move(key), std::move(value));
  }

  if (const GgufValue* alignment = file->Find("general.alignment"); alignment != nullptr) {
    if (alignment->type != GgufType::kUint32) {
      return parser.Corrupt(StrCat("key 'general.alignment' has type ",
                                   GgufTypeName(alignment->type), ", expected u32"));
    }
    const uint64_t a = alignment->uint_value;
    if (a == 0 || (a & (a - 1)) != 0) {
      return parser.Corrupt(StrCat("key 'general.alignment' is ", a, ", not a power of two"));
    }
    file->alignment_ = a;
  }

  // Tensor infos.
  file->tensors_.reserve(static_cast<size_t>(tensor_count));
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo info;
    LMSERVE_RETURN_IF_ERROR(parser.ReadString(&info.name, StrCat("tensor name #", i)));
    const std::string what = StrCat("tensor '", info.name, "'");
    uint32_t n_dims = 0;
    LMSERVE_RETURN_IF_ERROR(parser.Read(&n_dims, StrCat(what, " (dimension count)")));
    if (n_dims > kMaxDims) {
      return parser.Corrupt(StrCat(what, " has ", n_dims, " dimensions (at most ", kMaxDims, ")"));
    }
    uint64_t num_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = 0;
      LMSERVE_RETURN_IF_ERROR(parser.Read(&dim, StrCat(what, " (dimensions)")));
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(num_elements, dim, &num_elements) ||
          num_elements > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return parser.Corrupt(
            StrCat(what, " has an absurd shape (dimension ", d, " is ", dim, ")"));
      }
      info.dims.push_back(static_cast<int64_t>(dim));
    }
    LMSERVE_RETURN_IF_ERROR(parser.Read(&info.ggml_type, StrCat(what, " (type)")));
    LMSERVE_RETURN_IF_ERROR(parser.Read(&info.offset, StrCat(what, " (offset)")));
    std::optional<DType> dtype = DTypeFromGgmlType(info.ggml_type);
    if (!dtype.has_value()) {
      return absl::UnimplementedError(StrCat(path, ": ", what, " has type ",
                                             GgmlTypeName(info.ggml_type), " (", info.ggml_type,
                                             "), not supported; supported: ", kSupportedTypeList));
    }
    info.dtype = *dtype;
    const kernels::BlockLayout layout = kernels::GetBlockLayout(info.dtype);
    const uint64_t row = info.dims.empty() ? 1 : static_cast<uint64_t>(info.dims[0]);
    if (row % static_cast<uint64_t>(layout.elements_per_block) != 0) {
      return parser.Corrupt(StrCat(what, " of type ", kernels::DTypeName(info.dtype), " has ", row,
                                   " elements per row, not a multiple of its block size ",
                                   layout.elements_per_block));
    }
    uint64_t num_bytes = 0;
    if (__builtin_mul_overflow(num_elements / static_cast<uint64_t>(layout.elements_per_block),
                               static_cast<uint64_t>(layout.bytes_per_block), &num_bytes) ||
        num_bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return parser.Corrupt(StrCat(what, " has an absurd shape"));
    }
    info.num_bytes = static_cast<int64_t>(num_bytes);
    if (info.offset % file->alignment_ != 0) {
      return parser.Corrupt(StrCat(what, " has offset ", info.offset,
                                   ", not a multiple of the alignment ", file->alignment_));
    }
    if (!file->tensor_index_.emplace(info.name, file->tensors_.size()).second) {
      return parser.Corrupt(StrCat(what, " appears twice"));
    }
    file->tensors_.push_back(std::move(info));
  }

  // Data section: starts at the next multiple of the alignment (pos <= size, so no overflow).
  const uint64_t header_end = parser.reader().pos();
  file->data_offset_ = (header_end + file->alignment_ - 1) / file->alignment_ * file->alignment_;
  const uint64_t data_bytes = file->data_offset_ <= size ? size - file->data_offset_ : 0;
  const std::byte* data = base + std::min(file->data_offset_, size);
  for (GgufTensorInfo& info : file->tensors_) {
    const auto num_bytes = static_cast<uint64_t>(info.num_bytes);
    if (info.offset > data_bytes || num_bytes > data_bytes - info.offset) {
      return parser.Corrupt(StrCat("tensor '", info.name, "' (", num_bytes, " bytes at offset ",
                                   info.offset, ") runs past the end of the data section (",
                                   data_bytes, " bytes from byte ", file->data_offset_,
                                   "): truncated file?"));
    }
    info.data = data + info.offset;
  }
  return file;
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

std::optional<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr || v->type != GgufType::kString) return std::nullopt;
  return v->string_value;
}

std::optional<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* v = Find(key);
  return v == nullptr ? std::nullopt : v->AsInt();
}

std::optional<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* v = Find(key);
  return v == nullptr ? std::nullopt : v->AsFloat();
}

std::optional<bool> GgufFile::GetBool(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr || v->type != GgufType::kBool) return std::nullopt;
  return v->int_value != 0;
}

std::optional<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr || v->type != GgufType::kArray || v->element_type != GgufType::kString) {
    return std::nullopt;
  }
  std::vector<std::string> out;
  out.reserve(v->elements.size());
  for (const GgufValue& e : v->elements) out.push_back(e.string_value);
  return out;
}

std::optional<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr || v->type != GgufType::kArray ||
      !GgufValue::Int(v->element_type, 0).IsInteger()) {
    return std::nullopt;
  }
  std::vector<int64_t> out;
  out.reserve(v->elements.size());
  for (const GgufValue& e : v->elements) {
    std::optional<int64_t> i = e.AsInt();
    if (!i.has_value()) return std::nullopt;
    out.push_back(*i);
  }
  return out;
}

std::optional<std::vector<bool>> GgufFile::GetBoolArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr || v->type != GgufType::kArray || v->element_type != GgufType::kBool) {
    return std::nullopt;
  }
  std::vector<bool> out;
  out.reserve(v->elements.size());
  for (const GgufValue& e : v->elements) out.push_back(e.int_value != 0);
  return out;
}

std::optional<std::vector<double>> GgufFile::GetFloatArray(std::string_view key) const {
  const GgufValue* v = Find(key);
  if (v == nullptr || v->type != GgufType::kArray ||
      (v->element_type != GgufType::kFloat32 && v->element_type != GgufType::kFloat64)) {
    return std::nullopt;
  }
  std::vector<double> out;
  out.reserve(v->elements.size());
  for (const GgufValue& e : v->elements) out.push_back(e.float_value);
  return out;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace lmserve::engine
