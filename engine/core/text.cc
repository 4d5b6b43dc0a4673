#include "engine/core/text.h"

#include <algorithm>

namespace lmserve::engine {
namespace {

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";  // U+FFFD

bool EndsWith(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

class FunctionIncrementalDecoder final : public IncrementalTextDecoder {
 public:
  FunctionIncrementalDecoder(const FunctionTextDecoder::DecodeFn* decode,
                             std::span<const int32_t> context)
      : decode_(decode), tokens_(context.begin(), context.end()), read_offset_(tokens_.size()) {}

  std::string Append(int32_t token_id) override {
    tokens_.push_back(token_id);
    const std::string prefix_text = Decode(prefix_offset_, read_offset_);
    const std::string new_text = Decode(prefix_offset_, tokens_.size());
    if (new_text.size() > prefix_text.size() && !EndsWith(new_text, kReplacementCharacter) &&
        new_text.compare(0, prefix_text.size(), prefix_text) == 0) {
      prefix_offset_ = read_offset_;
      read_offset_ = tokens_.size();
      return new_text.substr(prefix_text.size());
    }
    return "";
  }

  std::string Finish() override {
    const std::string prefix_text = Decode(prefix_offset_, read_offset_);
    const std::string new_text = Decode(prefix_offset_, tokens_.size());
    prefix_offset_ = read_offset_ = tokens_.size();
    if (new_text.size() > prefix_text.size() &&
        new_text.compare(0, prefix_text.size(), prefix_text) == 0) {
      return new_text.substr(prefix_text.size());
    }
    return "";
  }

 private:
  std::string Decode(size_t begin, size_t end) const {
    return (*decode_)(std::span<const int32_t>(tokens_).subspan(begin, end - begin));
  }

  const FunctionTextDecoder::DecodeFn* decode_;
  std::vector<int32_t> tokens_;  // a few prompt tokens of context, then the generated ones
  size_t prefix_offset_ = 0;     // decode from here, for context
  size_t read_offset_ = 0;       // text up to here has been released
};

}  // namespace

std::unique_ptr<IncrementalTextDecoder> FunctionTextDecoder::NewSequence(
    std::span<const int32_t> prompt_token_ids) const {
  const size_t num_context =
      std::min(prompt_token_ids.size(), static_cast<size_t>(std::max(0, num_context_tokens_)));
  return std::make_unique<FunctionIncrementalDecoder>(
      &decode_, prompt_token_ids.subspan(prompt_token_ids.size() - num_context));
}

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings)
    : stop_strings_(std::move(stop_strings)) {}

std::string StopStringMatcher::Push(std::string_view text, bool can_stop,
                                    std::optional<std::string>* matched) {
  if (stopped_) return "";
  if (stop_strings_.empty()) return std::string(text);
  pending_.append(text);
  if (can_stop) {
    size_t best_position = std::string::npos;
    const std::string* best = nullptr;
    for (const std::string& stop : stop_strings_) {
      const size_t position = pending_.find(stop);
      if (position < best_position) {
        best_position = position;
        best = &stop;
      }
    }
    if (best != nullptr) {
      stopped_ = true;
      *matched = *best;
      std::string released = pending_.substr(0, best_position);
      pending_.clear();
      return released;
    }
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  const std::string_view pending = pending_;
  for (const std::string& stop_string : stop_strings_) {
    const std::string_view stop = stop_string;
    for (size_t length = std::min(stop.size() - 1, pending.size()); length > hold; --length) {
      if (pending.substr(pending.size() - length) == stop.substr(0, length)) {
        hold = length;
        break;
      }
    }
  }
  std::string released = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return released;
}

std::string StopStringMatcher::Flush() {
  std::string released = std::move(pending_);
  pending_.clear();
  return released;
}

}  // namespace lmserve::engine
