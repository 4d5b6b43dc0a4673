#include "engine/tokenizer/bpe_model.h"

#include <atomic>
#include <queue>

#include "common/status.h"
#include "common/strings.h"
#include "common/utf8.h"
#include "engine/tokenizer/unicode.h"

namespace lmserve::engine::tokenizer_internal {

// A symbol of a word being merged: a node of a doubly linked list over the word's bytes.
struct BpeModel::Symbol {
  int32_t id;       // ranked: the vocabulary id; scored: unused until emitted
  uint32_t start;   // byte offset in the word
  uint32_t length;  // bytes; 0 once merged into its left neighbour
  int32_t prev;     // index of the previous live symbol, -1 at the start
  int32_t next;     // index of the next live symbol, -1 at the end
};

namespace {

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

std::string ByteToken(int byte) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  return StrCat("<0x", kHex[byte >> 4], kHex[byte & 15], ">");
}

// The word caches of one thread.
struct ThreadWordCaches {
  struct Cache {
    uint64_t serial = 0;  // the model's; 0 for an unused slot
    uint64_t last_use = 0;
    absl::flat_hash_map<std::string, std::vector<int32_t>> words;
  };
  std::array<Cache, BpeModel::kCachedModelsPerThread> caches;
  uint64_t clock = 0;

  // The cache of model `serial`, taking over the least recently used slot if it has none.
  Cache& For(uint64_t serial) {
    ++clock;
    Cache* victim = &caches[0];
    for (Cache& cache : caches) {
      if (cache.serial == serial) {
        cache.last_use = clock;
        return cache;
      }
      if (cache.last_use < victim->last_use) victim = &cache;
    }
    victim->serial = serial;
    victim->last_use = clock;
    victim->words.clear();
    return *victim;
  }
};

std::atomic<uint64_t> next_serial{1};

}  // namespace

BpeModel::BpeModel(BpeOptions options)
    : options_(std::move(options)), serial_(next_serial.fetch_add(1)) {}

absl::Status BpeModel::BuildVocab(std::vector<std::pair<std::string, int32_t>> vocab) {
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab) {
    if (id < 0) return absl::InvalidArgumentError(StrCat("negative id for token ", token));
    max_id = std::max(max_id, id);
  }
  id_to_token_.assign(static_cast<size_t>(max_id) + 1, std::string());
  has_id_.assign(static_cast<size_t>(max_id) + 1, false);
  token_to_id_.reserve(vocab.size());
  for (auto& [token, id] : vocab) {
    if (has_id_[id]) return absl::InvalidArgumentError(StrCat("id ", id, " appears twice"));
    has_id_[id] = true;
    token_to_id_.insert_or_assign(token, id);
    id_to_token_[id] = std::move(token);
  }
  for (const auto& [token, id] : token_to_id_) {
    if (token.empty() || Utf8SequenceLength(token[0]) != token.size() || !IsValidUtf8(token)) {
      continue;
    }
    size_t pos = 0;
    char_to_id_[DecodeUtf8(token, &pos)] = id;
  }
  for (int b = 0; b < 256; ++b) byte_to_id_[b] = TokenToId(ByteToken(b));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::CreateRanked(
    std::vector<std::pair<std::string, int32_t>> vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options) {
  std::unique_ptr<BpeModel> model(new BpeModel(std::move(options)));
  LMSERVE_RETURN_IF_ERROR(model->BuildVocab(std::move(vocab)));
  const size_t prefix_length = model->options_.continuing_subword_prefix.size();
  model->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const int32_t left_id = model->TokenToId(left);
    const int32_t right_id = model->TokenToId(right);
    if (left_id < 0 || right_id < 0) {
      return absl::InvalidArgumentError(StrCat("merge ", rank, " (\"", left, "\" \"", right,
                                               "\") names a token not in the vocabulary"));
    }
    if (right.size() < prefix_length) {
      return absl::InvalidArgumentError(StrCat("merge ", rank, ": \"", right,
                                               "\" is shorter than the continuing-subword prefix"));
    }
    const std::string merged = StrCat(left, std::string_view(right).substr(prefix_length));
    const int32_t merged_id = model->TokenToId(merged);
    if (merged_id < 0) {
      return absl::InvalidArgumentError(
          StrCat("merge ", rank, ": the result \"", merged, "\" is not in the vocabulary"));
    }
    // A repeated pair keeps its last rank, as `tokenizers` does.
    model->merges_[PairKey(left_id, right_id)] = {static_cast<int32_t>(rank), merged_id};
  }
  return model;
}

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::CreateScored(std::vector<std::string> tokens,
                                                                 std::vector<float> scores,
                                                                 BpeOptions options) {
  if (scores.size() != tokens.size()) {
    return absl::InvalidArgumentError(
        StrCat(tokens.size(), " tokens but ", scores.size(), " scores"));
  }
  std::unique_ptr<BpeModel> model(new BpeModel(std::move(options)));
  model->scored_ = true;
  model->options_.ignore_merges = false;
  model->options_.continuing_subword_prefix.clear();
  model->options_.end_of_word_suffix.clear();
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    vocab.emplace_back(std::move(tokens[i]), static_cast<int32_t>(i));
  }
  LMSERVE_RETURN_IF_ERROR(model->BuildVocab(std::move(vocab)));
  model->scores_ = std::move(scores);
  return model;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

int32_t BpeModel::TokenToId(std::string_view token) const {
  const auto it = token_to_id_.find(AbslView(token));
  return it == token_to_id_.end() ? -1 : it->second;
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (const int32_t id = TokenToId(word); id >= 0) {
      ids->push_back(id);
      return;
    }
  }
  if (word.size() > kMaxCachedWordBytes) {
    TokenizeUncached(word, ids);
    return;
  }
  thread_local ThreadWordCaches thread_caches;
  ThreadWordCaches::Cache& cache = thread_caches.For(serial_);
  const auto it = cache.words.find(AbslView(word));
  if (it != cache.words.end()) {
    ids->insert(ids->end(), it->second.begin(), it->second.end());
    return;
  }
  const size_t first = ids->size();
  TokenizeUncached(word, ids);
  if (cache.words.size() >= kCacheEntries) cache.words.clear();
  cache.words.try_emplace(std::string(word), ids->begin() + first, ids->end());
}

void BpeModel::TokenizeUncached(std::string_view word, std::vector<int32_t>* ids) const {
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  if (scored_) {
    for (size_t pos = 0; pos < word.size();) {
      const size_t length = std::min(Utf8SequenceLength(word[pos]), word.size() - pos);
      const int32_t index = static_cast<int32_t>(symbols.size());
      symbols.push_back(
          {-1, static_cast<uint32_t>(pos), static_cast<uint32_t>(length), index - 1, index + 1});
      pos += length;
    }
    symbols.back().next = -1;
    MergeScored(word, &symbols);
    EmitScored(word, symbols, ids);
    return;
  }
  InitialSymbols(word, &symbols);
  if (symbols.empty()) return;
  MergeRanked(&symbols);
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

void BpeModel::InitialSymbols(std::string_view word, std::vector<Symbol>* symbols) const {
  const bool affixes =
      !options_.continuing_subword_prefix.empty() || !options_.end_of_word_suffix.empty();
  const auto add = [symbols](int32_t id, size_t start, size_t length) {
    const int32_t index = static_cast<int32_t>(symbols->size());
    symbols->push_back(
        {id, static_cast<uint32_t>(start), static_cast<uint32_t>(length), index - 1, index + 1});
  };
  // A pending unknown token: start and length, or length 0 for none.
  size_t unk_start = 0, unk_length = 0;
  std::string affixed;
  for (size_t pos = 0; pos < word.size();) {
    const size_t start = pos;
    int32_t id;
    std::string_view piece;
    if (!affixes) {
      const auto it = char_to_id_.find(DecodeUtf8(word, &pos));
      id = it == char_to_id_.end() ? -1 : it->second;
      piece = word.substr(start, pos - start);
    } else {
      pos += Utf8SequenceLength(word[pos]);
      affixed.clear();
      if (start > 0) affixed.append(options_.continuing_subword_prefix);
      affixed.append(word.substr(start, pos - start));
      if (pos == word.size()) affixed.append(options_.end_of_word_suffix);
      id = TokenToId(affixed);
      piece = affixed;
    }
    const size_t length = pos - start;
    if (id >= 0) {
      if (unk_length > 0) add(options_.unk_id, unk_start, unk_length);
      unk_length = 0;
      add(id, start, length);
      continue;
    }
    if (options_.byte_fallback) {
      bool all_bytes = true;
      for (const char c : piece) all_bytes = all_bytes && byte_to_id_[static_cast<uint8_t>(c)] >= 0;
      if (all_bytes) {
        // `tokenizers` adds the byte tokens without flushing a pending unknown token first.
        for (const char c : piece) add(byte_to_id_[static_cast<uint8_t>(c)], start, 1);
        continue;
      }
    }
    if (options_.unk_id < 0) continue;  // no unknown token: the character is dropped
    if (unk_length > 0 && options_.fuse_unk) {
      unk_length += length;
    } else {
      if (unk_length > 0) add(options_.unk_id, unk_start, unk_length);
      unk_start = start;
      unk_length = length;
    }
  }
  if (unk_length > 0) add(options_.unk_id, unk_start, unk_length);
  if (!symbols->empty()) symbols->back().next = -1;
}

void BpeModel::MergeRanked(std::vector<Symbol>* symbols_ptr) const {
  std::vector<Symbol>& symbols = *symbols_ptr;
  struct Candidate {
    int32_t rank;
    int32_t pos;  // index of the left symbol
    int32_t new_id;
  };
  // Lowest rank first, then leftmost.
  const auto worse = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> queue(worse);
  const auto find = [this](int32_t left_id, int32_t right_id) -> const MergeResult* {
    const auto it = merges_.find(PairKey(left_id, right_id));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const MergeResult* m = find(symbols[i].id, symbols[i + 1].id); m != nullptr) {
      queue.push({m->rank, static_cast<int32_t>(i), m->new_id});
    }
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (left.length == 0 || left.next < 0) continue;
    const Symbol right = symbols[left.next];
    // A stale entry: the pair at this position has changed since it was queued.
    const MergeResult* current = find(left.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;
    const int32_t right_index = left.next;
    left.id = top.new_id;
    left.length += right.length;
    left.next = right.next;
    symbols[right_index].length = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) {
      if (const MergeResult* m = find(symbols[left.prev].id, left.id); m != nullptr) {
        queue.push({m->rank, left.prev, m->new_id});
      }
    }
    if (left.next >= 0) {
      if (const MergeResult* m = find(left.id, symbols[left.next].id); m != nullptr) {
        queue.push({m->rank, top.pos, m->new_id});
      }
    }
  }
}

void BpeModel::MergeScored(std::string_view word, std::vector<Symbol>* symbols_ptr) const {
  std::vector<Symbol>& symbols = *symbols_ptr;
  struct Candidate {
    float score;
    int32_t left;
    int32_t right;
    uint32_t length;  // bytes of the merged piece: a stale entry no longer adds up to it
  };
  // Highest score first, then leftmost (llama.cpp's llm_bigram_spm order).
  const auto worse = [](const Candidate& a, const Candidate& b) {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> queue(worse);
  const auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const uint32_t length = symbols[left].length + symbols[right].length;
    const int32_t id = TokenToId(word.substr(symbols[left].start, length));
    if (id < 0) return;
    queue.push({scores_[id], left, right, length});
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    try_add(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.left];
    Symbol& right = symbols[top.right];
    if (left.length == 0 || right.length == 0 || left.length + right.length != top.length) {
      continue;
    }
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.left;
    try_add(left.prev, top.left);
    try_add(top.left, left.next);
  }
}

void BpeModel::EmitScored(std::string_view word, const std::vector<Symbol>& symbols,
                          std::vector<int32_t>* ids) const {
  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    const std::string_view piece = word.substr(symbols[i].start, symbols[i].length);
    if (const int32_t id = TokenToId(piece); id >= 0) {
      ids->push_back(id);
      continue;
    }
    // Not in the vocabulary (an unmerged character): its bytes, else the unknown token.
    for (const char c : piece) {
      const int32_t byte_id = options_.byte_fallback ? byte_to_id_[static_cast<uint8_t>(c)] : -1;
      if (byte_id >= 0) {
        ids->push_back(byte_id);
      } else if (options_.unk_id >= 0) {
        ids->push_back(options_.unk_id);
        break;  // one unknown token per character
      }
    }
  }
}

}  // namespace lmserve::engine::tokenizer_internal
