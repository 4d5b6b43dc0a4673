// The vocabulary as bytes: each token's decoded bytes, and a trie of them in preorder, built once
// per tokenizer. A constrained step walks the trie against a grammar state (matcher.h), so tokens
// that share a prefix share the work of matching it, and a prefix the grammar refuses prunes every
// token below it at once.
//
// Bytes: byte-level BPE pieces (GPT-2's byte-to-character map: "Ġhello" is " hello") are mapped
// back to bytes; SentencePiece pieces have "▁" as a space; byte-fallback tokens (<0xE2>) are their
// single byte. Special tokens are left out of the trie (they never match grammar text); EOS tokens
// are listed apart, allowed only where the grammar may end.

#ifndef LMSERVE_ENGINE_STRUCTURED_TOKEN_TRIE_H_
#define LMSERVE_ENGINE_STRUCTURED_TOKEN_TRIE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/tokenizer.h"

namespace lmserve::engine::structured {

class TokenTrie {
 public:
  // `token_bytes[id]`: the bytes of token id (nullopt-like: `excluded[id]` set for tokens the
  // grammar never allows, such as special tokens). `vocab_size` is the model's, >= the tokens
  // given (ids past them are never allowed). `eos_token_ids` are allowed where the grammar ends.
  static std::unique_ptr<TokenTrie> FromBytes(const std::vector<std::string>& token_bytes,
                                              const std::vector<uint8_t>& excluded,
                                              int64_t vocab_size,
                                              std::vector<int32_t> eos_token_ids);
  // From a tokenizer (see the top of this file). InvalidArgument when a token's piece cannot be
  // mapped to bytes.
  static absl::StatusOr<std::unique_ptr<TokenTrie>> FromTokenizer(
      const Tokenizer& tokenizer, int64_t vocab_size, std::vector<int32_t> eos_token_ids);

  int64_t vocab_size() const { return vocab_size_; }
  int64_t mask_words() const { return (vocab_size_ + 31) / 32; }
  const std::vector<int32_t>& eos_token_ids() const { return eos_token_ids_; }
  // The bytes of `token_id` ("" for excluded tokens and ids past the tokenizer's).
  const std::string& TokenBytes(int32_t token_id) const;
  bool Excluded(int32_t token_id) const;

  // Preorder nodes; node 0 is the root (depth 0, no byte). A node's subtree is [i, subtree_end).
  struct Node {
    uint8_t byte = 0;
    int32_t depth = 0;
    int32_t subtree_end = 0;
    int32_t first_token = 0;  // tokens_[first_token, first_token + num_tokens) end at this node
    int32_t num_tokens = 0;
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& node_tokens() const { return tokens_; }
  int32_t max_depth() const { return max_depth_; }

 private:
  int64_t vocab_size_ = 0;
  std::vector<std::string> token_bytes_;
  std::vector<uint8_t> excluded_;
  std::vector<int32_t> eos_token_ids_;
  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;
  int32_t max_depth_ = 0;
};

}  // namespace lmserve::engine::structured

#endif  // LMSERVE_ENGINE_STRUCTURED_TOKEN_TRIE_H_
