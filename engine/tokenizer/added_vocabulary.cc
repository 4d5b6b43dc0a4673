#include "engine/tokenizer/added_vocabulary.h"

#include <algorithm>
#include <utility>

#include "engine/tokenizer/unicode.h"

namespace lmserve::engine::tokenizer_internal {
namespace {

// `tokenizers`' word characters for single_word tokens.
bool IsWordCharacter(char32_t c) { return c == '_' || IsAlphanumeric(c); }

// The first character of `text`; REQUIRES: not empty.
char32_t FirstChar(std::string_view text) {
  size_t pos = 0;
  return DecodeUtf8(text, &pos);
}

// The start of the last character of `text`; REQUIRES: not empty, valid UTF-8.
size_t LastCharStart(std::string_view text) {
  size_t pos = text.size() - 1;
  while (pos > 0 && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) --pos;
  return pos;
}

}  // namespace

void AddedVocabulary::Matcher::Add(std::string_view pattern, int32_t token_index) {
  if (pattern.empty()) return;
  first_byte_[static_cast<uint8_t>(pattern[0])] = true;
  int32_t node = 0;
  for (const char c : pattern) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(c);
    const auto [it, inserted] = edges_.try_emplace(key, static_cast<int32_t>(terminal_.size()));
    if (inserted) terminal_.push_back(-1);
    node = it->second;
  }
  // The same content twice: the first token keeps it.
  if (terminal_[node] < 0) terminal_[node] = token_index;
}

std::pair<size_t, int32_t> AddedVocabulary::Matcher::LongestAt(std::string_view text,
                                                               size_t pos) const {
  std::pair<size_t, int32_t> best = {0, -1};
  if (!first_byte_[static_cast<uint8_t>(text[pos])]) return best;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const uint64_t key = (static_cast<uint64_t>(node) << 8) | static_cast<uint8_t>(text[i]);
    const auto it = edges_.find(key);
    if (it == edges_.end()) break;
    node = it->second;
    if (terminal_[node] >= 0) best = {i + 1 - pos, terminal_[node]};
  }
  return best;
}

AddedVocabulary::AddedVocabulary(std::vector<AddedToken> tokens, const Normalizer* normalizer)
    : tokens_(std::move(tokens)) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    AddedToken& token = tokens_[i];
    index_of_id_.try_emplace(token.id, i);
    token.piece = token.content;
    if (token.normalized && normalizer != nullptr) {
      // `tokenizers` also reports (and decodes) a normalized token by its normalized content.
      normalizer->Normalize(&token.piece);
      matchers_[1].Add(token.piece, static_cast<int32_t>(i));
    } else {
      matchers_[token.normalized].Add(token.content, static_cast<int32_t>(i));
    }
  }
}

const AddedToken* AddedVocabulary::Find(int32_t id) const {
  const auto it = index_of_id_.find(id);
  return it == index_of_id_.end() ? nullptr : &tokens_[it->second];
}

int32_t AddedVocabulary::IdOf(std::string_view content) const {
  for (const AddedToken& token : tokens_) {
    if (token.content == content) return token.id;
  }
  return -1;
}

void AddedVocabulary::Split(std::string_view text, bool normalized_set,
                            std::vector<Segment>* out) const {
  const Matcher& matcher = matchers_[normalized_set];
  size_t emitted = 0;  // text before this has been appended to `out`
  size_t pos = 0;      // where the search for the next match starts
  while (pos < text.size() && !matcher.empty()) {
    const auto [length, token_index] = matcher.LongestAt(text, pos);
    if (token_index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = tokens_[token_index];
    size_t start = pos;
    size_t stop = pos + length;
    pos = stop;  // the next search starts after this match, whether it is kept or not
    if (start < emitted) continue;  // inside whitespace that an rstrip token absorbed
    if (token.single_word) {
      const bool word_before =
          start > 0 &&
          IsWordCharacter(FirstChar(text.substr(LastCharStart(text.substr(0, start)))));
      const bool word_after = stop < text.size() && IsWordCharacter(FirstChar(text.substr(stop)));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      while (start > emitted) {
        const size_t char_start = LastCharStart(text.substr(0, start));
        if (!IsWhitespace(FirstChar(text.substr(char_start)))) break;
        start = char_start;
      }
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t next = stop;
        if (!IsWhitespace(DecodeUtf8(text, &next))) break;
        stop = next;
      }
    }
    if (emitted < start) out->push_back({-1, text.substr(emitted, start - emitted)});
    out->push_back({token.id, std::string_view()});
    emitted = stop;
  }
  if (emitted < text.size()) out->push_back({-1, text.substr(emitted)});
}

}  // namespace lmserve::engine::tokenizer_internal
