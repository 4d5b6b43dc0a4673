// Streaming detokenization: token ids in, one at a time; text out, in pieces that are each valid
// UTF-8 and whose concatenation equals Tokenizer::Decode of all the ids.
//
// Each step decodes a short window: the tokens of the last emitted piece plus the tokens not yet
// emitted, and emits what the window's text adds to the text of those last emitted tokens. Text is
// held back while it ends in U+FFFD (a multi-byte character whose bytes have not all arrived) and
// while the newest token is a byte-fallback token (<0xXX>: a run of them decodes as a unit).
// Because the window always starts right after emitted text, decoders that look at the start of the
// text (SentencePiece's "strip the leading space") see the same start as in the one-shot Decode.
//
// Thread safety: one Detokenizer per sequence, used by one thread at a time. The Tokenizer must
// outlive it.

#ifndef LMSERVE_ENGINE_TOKENIZER_DETOKENIZER_H_
#define LMSERVE_ENGINE_TOKENIZER_DETOKENIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "engine/tokenizer/tokenizer.h"

namespace lmserve::engine {

class Detokenizer {
 public:
  // `skip_special` as in Tokenizer::Decode.
  Detokenizer(const Tokenizer& tokenizer, bool skip_special)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}

  // A stream that continues `context` (e.g. the last few prompt tokens): the context's own text is
  // not returned, but it is decoded with the new tokens, so that the first new token keeps the
  // leading space a SentencePiece decoder strips at the start of a text. Then the concatenated
  // chunks equal Decode(context + ids) minus Decode(context) whenever the context ends with
  // complete characters.
  Detokenizer(const Tokenizer& tokenizer, bool skip_special, absl::Span<const int32_t> context)
      : tokenizer_(tokenizer),
        skip_special_(skip_special),
        ids_(context.begin(), context.end()),
        read_offset_(context.size()) {}

  // Adds `id` and returns the text that became final (often empty; always valid UTF-8).
  std::string Add(int32_t id);

  // At the end of the sequence: returns the text still held back (an incomplete character at the
  // end as U+FFFD, as Decode writes it).
  std::string Flush();

  // The context, then every id added so far.
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  // The text that ids_[prefix_offset_, end) adds to ids_[prefix_offset_, read_offset_).
  std::string Delta(bool* complete) const;

  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_offset_ = 0;  // the window starts here: the tokens of the last emitted piece
  size_t read_offset_ = 0;    // tokens before this have been emitted
};

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_TOKENIZER_DETOKENIZER_H_
