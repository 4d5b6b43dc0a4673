// Added tokens (special tokens such as "<|im_start|>", and user-defined ones) and the matcher that
// finds them in text ahead of the model, as `tokenizers`' AddedVocabulary does:
//
//  * Tokens whose `normalized` flag is false are matched in the raw text; the others in each piece
//  of
//    normalized text, against their own content normalized the same way.
//  * Matching is leftmost-longest and non-overlapping. A single_word token only matches between
//    non-word characters; lstrip/rstrip tokens absorb the whitespace before/after them.
//
// Thread safety: immutable after construction. Internal to engine/tokenizer.

#ifndef LMSERVE_ENGINE_TOKENIZER_ADDED_VOCABULARY_H_
#define LMSERVE_ENGINE_TOKENIZER_ADDED_VOCABULARY_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/tokenizer/pipeline.h"

namespace lmserve::engine::tokenizer_internal {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;      // skipped by Decode(skip_special)
  bool single_word = false;  // matches only as a whole word
  bool lstrip = false;       // absorbs whitespace on its left
  bool rstrip = false;       // absorbs whitespace on its right
  bool normalized = false;   // matched in normalized text rather than raw text
  // The token's string as the vocabulary reports it (IdToPiece, Decode): the content, normalized
  // when the token is. Set by AddedVocabulary.
  std::string piece;
};

class AddedVocabulary {
 public:
  // A piece of split text: an added token (id >= 0) or text between tokens (id == -1).
  struct Segment {
    int32_t id;
    std::string_view text;  // into the text passed to Split; empty for a token
  };

  AddedVocabulary() = default;
  // `normalizer` (may be null) is applied to the content of normalized tokens to match them.
  AddedVocabulary(std::vector<AddedToken> tokens, const Normalizer* normalizer);

  // Appends the segments of `text` to `out`: the raw-text tokens (normalized_set false) or the
  // normalized-text tokens (true). Text segments are never empty.
  void Split(std::string_view text, bool normalized_set, std::vector<Segment>* out) const;
  // Whether a set has any token (when not, Split yields the text whole).
  bool HasTokens(bool normalized_set) const { return !matchers_[normalized_set].empty(); }

  // The added token with id `id`, or nullptr.
  const AddedToken* Find(int32_t id) const;
  // The id of the added token with content `content`, or -1.
  int32_t IdOf(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // A byte trie over the patterns of one set.
  class Matcher {
   public:
    void Add(std::string_view pattern, int32_t token_index);
    bool empty() const { return terminal_.size() <= 1; }
    // The longest pattern starting at text[pos]: its length and token index, or {0, -1}.
    std::pair<size_t, int32_t> LongestAt(std::string_view text, size_t pos) const;

   private:
    std::array<bool, 256> first_byte_{};
    absl::flat_hash_map<uint64_t, int32_t> edges_;  // (node << 8 | byte) -> child node
    std::vector<int32_t> terminal_ = {-1};          // node -> token index, -1 if none
  };

  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int32_t, size_t> index_of_id_;
  std::array<Matcher, 2> matchers_;  // [normalized]
};

}  // namespace lmserve::engine::tokenizer_internal

#endif  // LMSERVE_ENGINE_TOKENIZER_ADDED_VOCABULARY_H_
