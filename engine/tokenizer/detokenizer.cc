#include "engine/tokenizer/detokenizer.h"

#include <algorithm>
#include <cstdint>
#include <string_view>

namespace lmserve::engine {
namespace {

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

bool EndsWithReplacement(std::string_view text) {
  return text.size() >= kReplacementCharacter.size() &&
         text.substr(text.size() - kReplacementCharacter.size()) == kReplacementCharacter;
}

}  // namespace

std::string Detokenizer::Delta(bool* complete) const {
  const absl::Span<const int32_t> ids(ids_);
  const std::string prefix_text =
      tokenizer_.Decode(ids.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_);
  const std::string new_text = tokenizer_.Decode(ids.subspan(prefix_offset_), skip_special_);
  *complete = !EndsWithReplacement(new_text);
  // The window starts after complete text, so the new text extends the prefix text. (Only a
  // context ending in an incomplete character breaks that: then what follows the common prefix is
  // new, from a character boundary on.)
  size_t common = 0;
  const size_t limit = std::min(prefix_text.size(), new_text.size());
  while (common < limit && prefix_text[common] == new_text[common]) ++common;
  if (common < prefix_text.size()) {
    while (common > 0 && (static_cast<uint8_t>(new_text[common]) & 0xC0) == 0x80) --common;
  }
  if (new_text.size() <= common) return std::string();
  return new_text.substr(common);
}

std::string Detokenizer::Add(int32_t id) {
  ids_.push_back(id);
  // Tokens that Decode leaves out change nothing, and must not end a run of byte-fallback tokens.
  if ((skip_special_ && tokenizer_.IsSpecial(id)) || id < 0 || id >= tokenizer_.vocab_size()) {
    return std::string();
  }
  // A run of byte-fallback tokens decodes as one unit (an invalid run becomes one U+FFFD per byte).
  if (tokenizer_.IsByteFallback(id)) return std::string();
  bool complete = false;
  std::string delta = Delta(&complete);
  if (delta.empty() || !complete) return std::string();
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return delta;
}

std::string Detokenizer::Flush() {
  bool complete = false;
  std::string delta = Delta(&complete);
  if (!delta.empty()) {
    prefix_offset_ = read_offset_;
    read_offset_ = ids_.size();
  }
  return delta;
}

}  // namespace lmserve::engine
