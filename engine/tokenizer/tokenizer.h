// Text <-> token ids for the models lmserve serves.
//
// One class for every source of a tokenizer:
//  * a Hugging Face tokenizer.json (byte-level BPE as GPT-2, Llama 3, Qwen2, SmolLM2 use it;
//    SentencePiece-style BPE with byte fallback as Llama 2 and Mistral use it), alone or in a model
//    directory beside tokenizer_config.json (special tokens, chat template);
//  * the tokenizer.ggml.* metadata of a GGUF file (models "gpt2" and "llama"), through
//    GgufTokenizerData (engine/tokenizer/gguf_tokenizer.h).
//
// Encoding follows Hugging Face `tokenizers` exactly (the tests compare with its output): added and
// special tokens are found in the text first (always, whatever add_special says), the remaining
// text is normalized, pre-tokenized into words and each word BPE-merged; add_special then applies
// the post-processor (e.g. prepends BOS). Decoding maps ids back to token strings and runs the
// decoder chain. GGUF tokenizers are built into the same stages, with the split regexes llama.cpp
// uses for each tokenizer.ggml.pre.
//
// Thread safety: a loaded Tokenizer is immutable (its word cache is internally synchronized); any
// number of threads may call Encode, Decode and the accessors at once.

#ifndef LMSERVE_ENGINE_TOKENIZER_TOKENIZER_H_
#define LMSERVE_ENGINE_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace lmserve::engine {

struct GgufTokenizerData;

namespace tokenizer_internal {
struct Pipeline;
}  // namespace tokenizer_internal

class Tokenizer {
 public:
  // Loads `path`: a tokenizer.json file (a tokenizer_config.json beside it is read too), a Hugging
  // Face model directory holding tokenizer.json (and optionally tokenizer_config.json and
  // chat_template.jinja), or a .gguf file. Errors name the file and what is wrong or unsupported.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path);

  // From the text of a tokenizer.json and, optionally, of a tokenizer_config.json ("" for none).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromHfJson(
      std::string_view tokenizer_json, std::string_view tokenizer_config_json = "");

  // From GGUF tokenizer metadata (see gguf_tokenizer.h).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufTokenizerData& data);

  // Internal: the loaders above build the pipeline.
  explicit Tokenizer(std::unique_ptr<const tokenizer_internal::Pipeline> pipeline);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // The ids of `text`. Added and special tokens written in the text are always recognized;
  // `add_special` adds the tokens the post-processor adds (BOS for Llama models). Invalid UTF-8 in
  // `text` is first replaced by U+FFFD (one per maximal ill-formed subpart).
  std::vector<int32_t> Encode(std::string_view text, bool add_special) const;

  // The text of `ids`: always valid UTF-8 (bytes that do not form characters become U+FFFD).
  // `skip_special` leaves out special tokens. Ids outside the vocabulary are skipped.
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special) const;

  // One past the largest id (vocabulary and added tokens).
  int32_t vocab_size() const;
  // The vocabulary string of `id` ("Ġhello", "▁hello", "<0x0A>", "<|im_end|>"); "" for an id
  // outside the vocabulary. Valid as long as the Tokenizer.
  std::string_view IdToPiece(int32_t id) const;
  // The id of vocabulary string `piece`, or nullopt.
  std::optional<int32_t> PieceToId(std::string_view piece) const;

  // Special tokens; nullopt where the tokenizer has none. eot is the end-of-turn token of chat
  // models
  // ("<|eot_id|>", "<|im_end|>", ...): from GGUF metadata, else found by its well-known text.
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> eot_id() const;
  std::optional<int32_t> pad_id() const;
  std::optional<int32_t> unk_id() const;
  // Their strings ("" when absent), for chat templates.
  std::string bos_token() const;
  std::string eos_token() const;
  // Whether Encode(text, /*add_special=*/true) adds BOS / EOS.
  bool add_bos() const;
  bool add_eos() const;

  // Whether `id` is a special (control) token: Decode(skip_special) leaves these out.
  bool IsSpecial(int32_t id) const;
  // Whether `id` is a byte-fallback token (<0xXX>) that the decoder turns into a raw byte.
  bool IsByteFallback(int32_t id) const;

  // The chat template (Jinja source) from tokenizer_config.json, chat_template.jinja or the GGUF
  // metadata; "" when there is none.
  const std::string& chat_template() const;

 private:
  std::unique_ptr<const tokenizer_internal::Pipeline> pipeline_;
};

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_TOKENIZER_TOKENIZER_H_
