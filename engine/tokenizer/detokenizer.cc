#include "engine/tokenizer/detokenizer.h"

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
  // The window starts after complete text, so the new text extends the prefix text.
  if (new_text.size() <= prefix_text.size() ||
      std::string_view(new_text).substr(0, prefix_text.size()) != prefix_text) {
    return std::string();
  }
  return new_text.substr(prefix_text.size());
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
