// Tokenizers from GGUF metadata (tokenizer.ggml.*), decoupled from the GGUF reader: the reader
// fills a GgufTokenizerData, Tokenizer::FromGguf builds the tokenizer from it.
//
// Supported tokenizer.ggml.model values, with llama.cpp's semantics:
//  * "gpt2": byte-level BPE with ranked merges. tokenizer.ggml.pre selects the split regexes, the
//    exact ones llama.cpp uses (GgufPreTokenizerRegexes); "llama-bpe"/"llama3" also take a word
//    that is a vocabulary entry whole (ignore_merges), as Llama 3's tokenizer.json does.
//  * "llama": SentencePiece BPE with scored merges: the text gets a leading space when
//    add_space_prefix (default true) and its spaces become "▁"; characters outside the vocabulary
//    fall back to <0xXX> byte tokens, else to the unknown token. Decoding turns "▁" back into
//    spaces and drops the leading one.
//
// Token types: CONTROL and UNKNOWN tokens are special (found in text, skipped by
// Decode(skip_special)); USER_DEFINED tokens are found in text but are not special; BYTE, NORMAL
// and UNUSED tokens belong to the model.

#ifndef LMSERVE_ENGINE_TOKENIZER_GGUF_TOKENIZER_H_
#define LMSERVE_ENGINE_TOKENIZER_GGUF_TOKENIZER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace lmserve::engine {

class GgufFile;

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class GgufTokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// The tokenizer.ggml.* metadata of a GGUF file, in plain C++ types.
struct GgufTokenizerData {
  std::string model;                 // tokenizer.ggml.model: "gpt2" or "llama"
  std::string pre;                   // tokenizer.ggml.pre ("" when absent: "default")
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens, by id
  std::vector<float> scores;         // tokenizer.ggml.scores (empty when absent)
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type (empty: all normal)
  std::vector<std::string> merges;   // tokenizer.ggml.merges, "left right", in rank order
  // tokenizer.ggml.{bos,eos,eot,padding,unknown}_token_id
  std::optional<int32_t> bos_id, eos_id, eot_id, pad_id, unk_id;
  // tokenizer.ggml.add_bos_token / add_eos_token / add_space_prefix (nullopt: the model's default)
  std::optional<bool> add_bos, add_eos, add_space_prefix;
  std::string chat_template;  // tokenizer.chat_template
};

// The split regexes llama.cpp applies, one after the other (each splits the pieces the previous one
// made, keeping matches and the text between them), for tokenizer.ggml.pre `pre`. Unimplemented for
// a value this table does not know.
absl::StatusOr<std::vector<std::string>> GgufPreTokenizerRegexes(std::string_view pre);

// Reads the keys listed in GgufTokenizerData from `file`. Absent optional keys stay nullopt/empty;
// a missing tokenizer.ggml.model or tokenizer.ggml.tokens, or a key of the wrong type, is an
// InvalidArgument error naming the file and the key.
absl::StatusOr<GgufTokenizerData> GgufTokenizerDataFromFile(const GgufFile& file);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_TOKENIZER_GGUF_TOKENIZER_H_
