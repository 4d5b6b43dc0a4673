// Byte-pair-encoding models, in the two flavours real checkpoints use:
//
//  * Ranked merges (Hugging Face `tokenizers` BPE; GGUF tokenizer.ggml.model "gpt2"): a word starts
//    as one symbol per character; the adjacent pair whose merge comes earliest in the merge list is
//    merged, leftmost first among equals, until no listed merge applies.
//  * Scored merges (SentencePiece BPE as llama.cpp runs it; GGUF tokenizer.ggml.model "llama"): a
//    word starts as one symbol per character; the adjacent pair whose concatenation is a vocabulary
//    entry with the highest score is merged, leftmost first among equals, until no pair is in the
//    vocabulary.
//
// Both run in O(n log n) for a word of n characters: the symbols form a doubly linked list and the
// candidate merges a priority queue whose stale entries are skipped when popped. Results for words
// up to kMaxCachedWordBytes are kept in a per-thread cache (no locks on the hot path): each thread
// keeps the words of the kCachedModelsPerThread models it used last, at most kCacheEntries each,
// cleared when full.
//
// Characters that are not in the vocabulary become byte-fallback tokens (<0xXX>) where the options
// allow and the vocabulary has them, else the unknown token (fused into one for a run when
// fuse_unk), else they are dropped, as `tokenizers` does.
//
// Thread safety: immutable after creation (the caches are per thread); Tokenize may be called from
// many threads at once. Internal to engine/tokenizer.

#ifndef LMSERVE_ENGINE_TOKENIZER_BPE_MODEL_H_
#define LMSERVE_ENGINE_TOKENIZER_BPE_MODEL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/pipeline.h"

namespace lmserve::engine::tokenizer_internal {

struct BpeOptions {
  int32_t unk_id = -1;         // -1: no unknown token
  bool fuse_unk = false;       // one unknown token for a run of unknown characters
  bool byte_fallback = false;  // unknown characters become <0xXX> tokens
  bool ignore_merges = false;  // a word that is a vocabulary entry is taken whole (ranked only)
  std::string continuing_subword_prefix;  // ranked only: prefixed to every character but the first
  std::string end_of_word_suffix;         // ranked only: suffixed to the last character
};

class BpeModel : public Model {
 public:
  // Ranked merges. `vocab`: (token, id) pairs, ids unique and >= 0; `merges`: (left, right) in
  // rank order. Every merge must name vocabulary entries, and so must its result.
  static absl::StatusOr<std::unique_ptr<BpeModel>> CreateRanked(
      std::vector<std::pair<std::string, int32_t>> vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);

  // Scored merges. `tokens[i]` is the entry of id i, `scores[i]` its score (same size). When a
  // string appears twice, the later id wins, as in llama.cpp.
  static absl::StatusOr<std::unique_ptr<BpeModel>> CreateScored(std::vector<std::string> tokens,
                                                                std::vector<float> scores,
                                                                BpeOptions options);

  static constexpr size_t kMaxCachedWordBytes = 256;
  static constexpr size_t kCacheEntries = 8192;
  static constexpr int kCachedModelsPerThread = 2;

  void Tokenize(std::string_view word, std::vector<int32_t>* ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(id_to_token_.size()); }
  const std::string* IdToToken(int32_t id) const override;
  int32_t TokenToId(std::string_view token) const override;

 private:
  struct Symbol;
  struct MergeResult {
    int32_t rank;
    int32_t new_id;
  };

  explicit BpeModel(BpeOptions options);
  absl::Status BuildVocab(std::vector<std::pair<std::string, int32_t>> vocab);

  void TokenizeUncached(std::string_view word, std::vector<int32_t>* ids) const;
  // The initial symbols of `word` (ranked flavour), with unknown and byte-fallback handling.
  void InitialSymbols(std::string_view word, std::vector<Symbol>* symbols) const;
  void MergeRanked(std::vector<Symbol>* symbols) const;
  void MergeScored(std::string_view word, std::vector<Symbol>* symbols) const;
  void EmitScored(std::string_view word, const std::vector<Symbol>& symbols,
                  std::vector<int32_t>* ids) const;

  BpeOptions options_;
  bool scored_ = false;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;  // false for holes in the id space
  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  absl::flat_hash_map<char32_t, int32_t> char_to_id_;  // single-character entries
  std::array<int32_t, 256> byte_to_id_;                // <0xXX> entries, -1 where absent
  absl::flat_hash_map<uint64_t, MergeResult> merges_;  // ranked: (left id, right id) -> merge
  std::vector<float> scores_;                          // scored: by id

  uint64_t serial_;  // distinguishes this model's cache from other models', for ever
};

}  // namespace lmserve::engine::tokenizer_internal

#endif  // LMSERVE_ENGINE_TOKENIZER_BPE_MODEL_H_
