// A minimal GGUF metadata reader for the tokenizer tests only: it reads the tokenizer.* keys of a GGUF
// file into GgufTokenizerData and skips everything else. The engine's own GGUF reader
// (engine/model/gguf.h) replaces it in production through GgufTokenizerDataFromFile.

#ifndef LMSERVE_TESTS_ENGINE_TOKENIZER_GGUF_TEST_READER_H_
#define LMSERVE_TESTS_ENGINE_TOKENIZER_GGUF_TEST_READER_H_

#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "engine/tokenizer/gguf_tokenizer.h"

namespace lmserve::testing {

class GgufTestReader {
 public:
  // Returns nullopt (and sets *error) on a malformed file.
  static std::optional<engine::GgufTokenizerData> Read(const std::string& path, std::string* error) {
    std::ifstream in(path, std::ios::binary);
    GgufTestReader reader(in);
    engine::GgufTokenizerData data;
    if (!reader.ReadAll(&data)) {
      *error = reader.error_;
      return std::nullopt;
    }
    return data;
  }

 private:
  enum Type : uint32_t {
    kU8 = 0, kI8, kU16, kI16, kU32, kI32, kF32, kBool, kString, kArray, kU64, kI64, kF64
  };

  explicit GgufTestReader(std::ifstream& in) : in_(in) {}

  template <typename T>
  bool Pod(T* value) {
    in_.read(reinterpret_cast<char*>(value), sizeof(T));
    return Ok("truncated file");
  }
  bool Ok(const char* what) {
    if (!in_) error_ = what;
    return static_cast<bool>(in_);
  }
  bool String(std::string* s) {
    uint64_t length;
    if (!Pod(&length) || length > (1u << 30)) return false;
    s->resize(length);
    in_.read(s->data(), static_cast<std::streamsize>(length));
    return Ok("truncated string");
  }
  static size_t ScalarSize(uint32_t type) {
    switch (type) {
      case kU8: case kI8: case kBool: return 1;
      case kU16: case kI16: return 2;
      case kU32: case kI32: case kF32: return 4;
      case kU64: case kI64: case kF64: return 8;
      default: return 0;
    }
  }
  // Reads an integer-like scalar of `type` as int64 (floats are truncated).
  bool Scalar(uint32_t type, int64_t* out, double* real = nullptr) {
    uint8_t bytes[8] = {};
    const size_t size = ScalarSize(type);
    if (size == 0) {
      error_ = "bad scalar type";
      return false;
    }
    in_.read(reinterpret_cast<char*>(bytes), static_cast<std::streamsize>(size));
    if (!Ok("truncated scalar")) return false;
    int64_t v = 0;
    double r = 0;
    switch (type) {
      case kU8: case kBool: v = bytes[0]; break;
      case kI8: v = static_cast<int8_t>(bytes[0]); break;
      case kU16: { uint16_t x; std::memcpy(&x, bytes, 2); v = x; break; }
      case kI16: { int16_t x; std::memcpy(&x, bytes, 2); v = x; break; }
      case kU32: { uint32_t x; std::memcpy(&x, bytes, 4); v = x; break; }
      case kI32: { int32_t x; std::memcpy(&x, bytes, 4); v = x; break; }
      case kF32: { float x; std::memcpy(&x, bytes, 4); r = x; v = static_cast<int64_t>(x); break; }
      case kU64: { uint64_t x; std::memcpy(&x, bytes, 8); v = static_cast<int64_t>(x); break; }
      case kI64: { std::memcpy(&v, bytes, 8); break; }
      case kF64: { std::memcpy(&r, bytes, 8); v = static_cast<int64_t>(r); break; }
    }
    if (real != nullptr) *real = type == kF32 || type == kF64 ? r : static_cast<double>(v);
    *out = v;
    return true;
  }
  bool Skip(uint32_t type) {
    if (type == kString) {
      std::string ignored;
      return String(&ignored);
    }
    if (type == kArray) {
      uint32_t element_type;
      uint64_t count;
      if (!Pod(&element_type) || !Pod(&count)) return false;
      for (uint64_t i = 0; i < count; ++i) {
        if (!Skip(element_type)) return false;
      }
      return true;
    }
    int64_t ignored;
    return Scalar(type, &ignored);
  }

  bool ReadAll(engine::GgufTokenizerData* data) {
    char magic[4];
    in_.read(magic, 4);
    if (!Ok("cannot read") || std::memcmp(magic, "GGUF", 4) != 0) {
      error_ = "not a GGUF file";
      return false;
    }
    uint32_t version;
    uint64_t num_tensors, num_keys;
    if (!Pod(&version) || !Pod(&num_tensors) || !Pod(&num_keys)) return false;
    for (uint64_t k = 0; k < num_keys; ++k) {
      std::string key;
      uint32_t type;
      if (!String(&key) || !Pod(&type)) return false;
      if (key.rfind("tokenizer.", 0) != 0) {
        if (!Skip(type)) return false;
        continue;
      }
      if (type == kString) {
        std::string value;
        if (!String(&value)) return false;
        if (key == "tokenizer.ggml.model") data->model = value;
        if (key == "tokenizer.ggml.pre") data->pre = value;
        if (key == "tokenizer.chat_template") data->chat_template = value;
      } else if (type == kArray) {
        uint32_t element_type;
        uint64_t count;
        if (!Pod(&element_type) || !Pod(&count)) return false;
        for (uint64_t i = 0; i < count; ++i) {
          if (element_type == kString) {
            std::string value;
            if (!String(&value)) return false;
            if (key == "tokenizer.ggml.tokens") data->tokens.push_back(std::move(value));
            if (key == "tokenizer.ggml.merges") data->merges.push_back(std::move(value));
          } else {
            int64_t value;
            double real;
            if (!Scalar(element_type, &value, &real)) return false;
            if (key == "tokenizer.ggml.scores") data->scores.push_back(static_cast<float>(real));
            if (key == "tokenizer.ggml.token_type") {
              data->token_types.push_back(static_cast<int32_t>(value));
            }
          }
        }
      } else {
        int64_t value;
        if (!Scalar(type, &value)) return false;
        const auto id = static_cast<int32_t>(value);
        if (key == "tokenizer.ggml.bos_token_id") data->bos_id = id;
        if (key == "tokenizer.ggml.eos_token_id") data->eos_id = id;
        if (key == "tokenizer.ggml.eot_token_id") data->eot_id = id;
        if (key == "tokenizer.ggml.padding_token_id") data->pad_id = id;
        if (key == "tokenizer.ggml.unknown_token_id") data->unk_id = id;
        if (key == "tokenizer.ggml.add_bos_token") data->add_bos = value != 0;
        if (key == "tokenizer.ggml.add_eos_token") data->add_eos = value != 0;
        if (key == "tokenizer.ggml.add_space_prefix") data->add_space_prefix = value != 0;
      }
    }
    return true;
  }

  std::ifstream& in_;
  std::string error_;
};

}  // namespace lmserve::testing

#endif  // LMSERVE_TESTS_ENGINE_TOKENIZER_GGUF_TEST_READER_H_
