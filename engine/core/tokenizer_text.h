// The engine's TextDecoder over the real tokenizer: one engine::Detokenizer per sequence, which
// streams valid UTF-8 (holding back incomplete characters and runs of byte-fallback tokens) and
// keeps a SentencePiece leading space by decoding a few prompt tokens as context.

#ifndef LMSERVE_ENGINE_CORE_TOKENIZER_TEXT_H_
#define LMSERVE_ENGINE_CORE_TOKENIZER_TEXT_H_

#include <cstdint>
#include <memory>
#include <span>

#include "engine/core/text.h"
#include "engine/tokenizer/tokenizer.h"

namespace lmserve::engine {

class TokenizerTextDecoder final : public TextDecoder {
 public:
  // `tokenizer` is not owned and must outlive this decoder and every sequence it makes.
  // `skip_special`: leave special tokens out of the text (as Tokenizer::Decode).
  explicit TokenizerTextDecoder(const Tokenizer* tokenizer, bool skip_special = true,
                                int32_t num_context_tokens = 5)
      : tokenizer_(tokenizer),
        skip_special_(skip_special),
        num_context_tokens_(num_context_tokens) {}

  std::unique_ptr<IncrementalTextDecoder> NewSequence(
      std::span<const int32_t> prompt_token_ids) const override;

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  int32_t num_context_tokens_;
};

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_CORE_TOKENIZER_TEXT_H_
