#include "engine/core/tokenizer_text.h"

#include <algorithm>
#include <string>

#include "absl/types/span.h"
#include "engine/tokenizer/detokenizer.h"

namespace lmserve::engine {
namespace {

class DetokenizerStream final : public IncrementalTextDecoder {
 public:
  DetokenizerStream(const Tokenizer& tokenizer, bool skip_special, std::span<const int32_t> context)
      : detokenizer_(tokenizer, skip_special, absl::MakeConstSpan(context.data(), context.size())) {
  }

  std::string Append(int32_t token_id) override { return detokenizer_.Add(token_id); }
  std::string Finish() override { return detokenizer_.Flush(); }

 private:
  Detokenizer detokenizer_;
};

}  // namespace

std::unique_ptr<IncrementalTextDecoder> TokenizerTextDecoder::NewSequence(
    std::span<const int32_t> prompt_token_ids) const {
  const size_t num_context =
      std::min(prompt_token_ids.size(), static_cast<size_t>(std::max(0, num_context_tokens_)));
  return std::make_unique<DetokenizerStream>(
      *tokenizer_, skip_special_, prompt_token_ids.subspan(prompt_token_ids.size() - num_context));
}

}  // namespace lmserve::engine
