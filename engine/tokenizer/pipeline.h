// The stages of a tokenizer, as Hugging Face `tokenizers` defines them: normalizer -> pre-tokenizer
// -> model on the way in, post-processor after the model, decoder on the way out. Tokenizer (the
// public class) chains them; tokenizer.json and GGUF metadata are both turned into these stages.
//
// Differences from `tokenizers`: no offsets or alignments are tracked (nothing here needs them),
// and only single sequences are post-processed (no pairs).
//
// Contracts shared by every stage: text in and out is valid UTF-8; the stages are immutable after
// construction and safe to call from many threads at once.
//
// Internal to engine/tokenizer.

#ifndef LMSERVE_ENGINE_TOKENIZER_PIPELINE_H_
#define LMSERVE_ENGINE_TOKENIZER_PIPELINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/regex.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine::tokenizer_internal {

// Rewrites a piece of text before it is split (Prepend, Replace, NFC, ...).
class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void Normalize(std::string* text) const = 0;
};

// Splits pieces of text into words (and may rewrite them: ByteLevel maps bytes to characters).
class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces each of `pieces` by the pieces it splits into, in order. Empty pieces are dropped.
  // `*starts_text`: whether pieces->front() begins at the start of the text being encoded
  // (Metaspace prepends only there); a stage that drops that beginning clears it.
  virtual void PreTokenize(std::vector<std::string>* pieces, bool* starts_text) const = 0;
};

// Turns one word into token ids (BPE).
class Model {
 public:
  virtual ~Model() = default;
  // Appends the ids of `word` to `ids`.
  virtual void Tokenize(std::string_view word, std::vector<int32_t>* ids) const = 0;
  // One past the largest id of the model's vocabulary.
  virtual int32_t vocab_size() const = 0;
  // The vocabulary entry of `id`; nullptr when the model has no such id.
  virtual const std::string* IdToToken(int32_t id) const = 0;
  // The id of vocabulary entry `token`, or -1.
  virtual int32_t TokenToId(std::string_view token) const = 0;
};

// Adds special tokens around an encoded sequence (applied only when special tokens are requested).
class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void Process(std::vector<int32_t>* ids) const = 0;
};

// Turns token strings back into text. Like `tokenizers`, a decoder maps a list of token strings to
// a list of strings (so that the stages of a Sequence compose); the caller concatenates the result.
class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void DecodeChain(std::vector<std::string>* tokens) const = 0;
};

// A Split-style pattern: a literal string or a regular expression.
struct Pattern {
  std::string literal;           // when regex is null
  std::unique_ptr<Regex> regex;  // null for a literal

  // The [start, end) ranges of successive non-overlapping matches of the pattern in `text`.
  std::vector<std::pair<size_t, size_t>> FindAll(std::string_view text) const;
};

// What Split does with the pattern's matches (`tokenizers`' SplitDelimiterBehavior).
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// ---- Constructors used by the GGUF builder
// ---------------------------------------------------------
std::unique_ptr<Normalizer> MakePrependNormalizer(std::string prefix);
std::unique_ptr<Normalizer> MakeReplaceNormalizer(Pattern pattern, std::string content);
std::unique_ptr<Normalizer> MakeSequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> stages);

std::unique_ptr<PreTokenizer> MakeByteLevelPreTokenizer(bool add_prefix_space, bool use_regex);
std::unique_ptr<PreTokenizer> MakeSplitPreTokenizer(Pattern pattern, SplitBehavior behavior,
                                                    bool invert);
std::unique_ptr<PreTokenizer> MakeDigitsPreTokenizer(bool individual_digits);
// `tokenizers`' PrependScheme of Metaspace.
enum class PrependScheme { kAlways, kNever, kFirst };
std::unique_ptr<PreTokenizer> MakeMetaspacePreTokenizer(std::string replacement,
                                                        PrependScheme prepend_scheme, bool split);
std::unique_ptr<PreTokenizer> MakeSequencePreTokenizer(
    std::vector<std::unique_ptr<PreTokenizer>> stages);

std::unique_ptr<Decoder> MakeByteLevelDecoder();
std::unique_ptr<Decoder> MakeReplaceDecoder(Pattern pattern, std::string content);
std::unique_ptr<Decoder> MakeByteFallbackDecoder();
std::unique_ptr<Decoder> MakeFuseDecoder();
std::unique_ptr<Decoder> MakeStripDecoder(std::string content, int start, int stop);
std::unique_ptr<Decoder> MakeMetaspaceDecoder(std::string replacement,
                                              PrependScheme prepend_scheme);
std::unique_ptr<Decoder> MakeSequenceDecoder(std::vector<std::unique_ptr<Decoder>> stages);

// Prepends `prefix` and appends `suffix` (ids) to every sequence.
std::unique_ptr<PostProcessor> MakeTemplatePostProcessor(std::vector<int32_t> prefix,
                                                         std::vector<int32_t> suffix);

// ---- tokenizer.json ----------------------------------------------------------------------------
// Each builds a stage from its tokenizer.json object. A JSON null yields nullptr (no stage).
// Unsupported types are an Unimplemented error naming the type; malformed objects InvalidArgument.
absl::StatusOr<std::unique_ptr<Normalizer>> NormalizerFromJson(const nlohmann::json& j);
absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizerFromJson(const nlohmann::json& j);
absl::StatusOr<std::unique_ptr<Decoder>> DecoderFromJson(const nlohmann::json& j);
absl::StatusOr<std::unique_ptr<PostProcessor>> PostProcessorFromJson(const nlohmann::json& j);

// Metaspace's "prepend_scheme" (or the older "add_prefix_space") and "replacement".
absl::StatusOr<PrependScheme> MetaspaceSchemeFromJson(const nlohmann::json& j);
absl::StatusOr<std::string> MetaspaceReplacementFromJson(const nlohmann::json& j);

// Reads a Split/Replace "pattern" object: {"String": "..."} or {"Regex": "..."}.
absl::StatusOr<Pattern> PatternFromJson(const nlohmann::json& j);

// The byte that a byte-fallback token string ("<0x41>") stands for, or -1 if it is not one. Follows
// `tokenizers`' ByteFallback decoder exactly.
int ByteFallbackValue(std::string_view token);

}  // namespace lmserve::engine::tokenizer_internal

#endif  // LMSERVE_ENGINE_TOKENIZER_PIPELINE_H_
