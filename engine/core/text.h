// Text for the engine: the seam to a tokenizer, and stop-string matching.
//
// The engine does not depend on a tokenizer implementation. It takes a TextDecoder, which makes one
// IncrementalTextDecoder per generated sequence; FunctionTextDecoder adapts any "token ids -> text"
// function (such as a tokenizer's Decode) into one, with the prefix-offset method of Hugging Face's
// text-generation-inference: text is released only when it no longer ends in an incomplete
// character.

#ifndef LMSERVE_ENGINE_CORE_TEXT_H_
#define LMSERVE_ENGINE_CORE_TEXT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace lmserve::engine {

// Turns one sequence's generated tokens into text, a token at a time. Engine thread only.
class IncrementalTextDecoder {
 public:
  virtual ~IncrementalTextDecoder() = default;
  // Appends a generated token; returns the text that became final (empty while, say, a multi-byte
  // character is incomplete).
  virtual std::string Append(int32_t token_id) = 0;
  // Generation ended: returns whatever is still held back.
  virtual std::string Finish() = 0;
};

// Makes incremental decoders. Thread-safe (const).
class TextDecoder {
 public:
  virtual ~TextDecoder() = default;
  // A decoder for a sequence that continues `prompt_token_ids` (its last tokens give context, e.g.
  // for a SentencePiece leading space); the prompt's own text is not returned.
  virtual std::unique_ptr<IncrementalTextDecoder> NewSequence(
      std::span<const int32_t> prompt_token_ids) const = 0;
};

// A TextDecoder over a function that decodes a whole token sequence, e.g. Tokenizer::Decode.
// The function must be thread-safe. U+FFFD at the end of a decode marks an incomplete character.
class FunctionTextDecoder final : public TextDecoder {
 public:
  using DecodeFn = std::function<std::string(std::span<const int32_t> token_ids)>;
  explicit FunctionTextDecoder(DecodeFn decode, int32_t num_context_tokens = 5)
      : decode_(std::move(decode)), num_context_tokens_(num_context_tokens) {}
  std::unique_ptr<IncrementalTextDecoder> NewSequence(
      std::span<const int32_t> prompt_token_ids) const override;

 private:
  DecodeFn decode_;
  int32_t num_context_tokens_;
};

// Finds stop strings in streamed text. Text that could be the start of a stop string is held back
// until it is known not to be; a stop string is never released, nor anything after it. Matches
// span any number of pushes (token boundaries).
class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stop_strings);

  // Appends `text`. Returns the text that may be released now. When `can_stop` and a stop string
  // is complete, returns the text before its earliest occurrence, sets `matched` to it and ignores
  // every later push. Without stop strings, returns `text` as is.
  std::string Push(std::string_view text, bool can_stop, std::optional<std::string>* matched);
  // Releases the held-back text (generation ended for another reason).
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stop_strings_;
  std::string pending_;  // received, not yet released
  bool stopped_ = false;
};

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_CORE_TEXT_H_
