#include "engine/structured/token_trie.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "common/strings.h"

namespace lmserve::engine::structured {
namespace {

// Decodes one UTF-8 code point at text[*i]; nullopt on invalid input.
std::optional<uint32_t> NextCodepoint(std::string_view text, size_t* i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t lead = byte(*i);
  int length = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 0;
  if (length == 0 || *i + length > text.size()) return std::nullopt;
  uint32_t codepoint = length == 1 ? lead : lead & (0x7F >> length);
  for (int k = 1; k < length; ++k) {
    if ((byte(*i + k) & 0xC0) != 0x80) return std::nullopt;
    codepoint = (codepoint << 6) | (byte(*i + k) & 0x3F);
  }
  *i += length;
  return codepoint;
}

// GPT-2's bytes_to_unicode, inverted: the character each byte is written as -> the byte.
std::vector<int32_t> ByteLevelInverse() {
  std::vector<int32_t> inverse(512, -1);
  int32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const int32_t codepoint = printable ? b : next++;
    inverse[codepoint] = b;
  }
  return inverse;
}

std::optional<std::string> ByteLevelBytes(std::string_view piece,
                                          const std::vector<int32_t>& inverse) {
  std::string out;
  for (size_t i = 0; i < piece.size();) {
    std::optional<uint32_t> codepoint = NextCodepoint(piece, &i);
    if (!codepoint.has_value() || *codepoint >= inverse.size() || inverse[*codepoint] < 0) {
      return std::nullopt;
    }
    out.push_back(static_cast<char>(inverse[*codepoint]));
  }
  return out;
}

std::optional<uint8_t> ByteFallbackByte(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return std::nullopt;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                             : -1;
    if (digit < 0) return std::nullopt;
    value = value * 16 + digit;
  }
  return static_cast<uint8_t>(value);
}

constexpr std::string_view kSentencePieceSpace = "\xE2\x96\x81";  // U+2581
constexpr std::string_view kByteLevelSpace = "\xC4\xA0";          // U+0120 'Ġ'

}  // namespace

const std::string& TokenTrie::TokenBytes(int32_t token_id) const {
  static const std::string kEmpty;
  if (token_id < 0 || static_cast<size_t>(token_id) >= token_bytes_.size()) return kEmpty;
  return token_bytes_[token_id];
}

bool TokenTrie::Excluded(int32_t token_id) const {
  return token_id < 0 || static_cast<size_t>(token_id) >= excluded_.size() || excluded_[token_id];
}

std::unique_ptr<TokenTrie> TokenTrie::FromBytes(const std::vector<std::string>& token_bytes,
                                                const std::vector<uint8_t>& excluded,
                                                int64_t vocab_size,
                                                std::vector<int32_t> eos_token_ids) {
  auto trie = std::make_unique<TokenTrie>();
  trie->vocab_size_ = vocab_size;
  const size_t num_tokens = std::min<size_t>(token_bytes.size(), static_cast<size_t>(vocab_size));
  trie->token_bytes_.assign(token_bytes.begin(), token_bytes.begin() + num_tokens);
  trie->excluded_.assign(num_tokens, 1);
  for (size_t id = 0; id < num_tokens; ++id) {
    trie->excluded_[id] = (id < excluded.size() && excluded[id]) || token_bytes[id].empty();
    if (trie->excluded_[id]) trie->token_bytes_[id].clear();
  }
  trie->eos_token_ids_ = std::move(eos_token_ids);

  // Sort the tokens by bytes; the preorder trie then comes from one pass over shared prefixes.
  std::vector<int32_t> order;
  for (size_t id = 0; id < num_tokens; ++id) {
    if (!trie->excluded_[id]) order.push_back(static_cast<int32_t>(id));
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return trie->token_bytes_[a] != trie->token_bytes_[b]
               ? trie->token_bytes_[a] < trie->token_bytes_[b]
               : a < b;
  });
  std::vector<Node>& nodes = trie->nodes_;
  nodes.push_back(Node{});
  std::vector<int32_t> path = {0};  // node index per depth along the current token
  std::string_view previous;
  // Tokens are grouped per node: node_tokens_ is filled in preorder, since sorted order is preorder.
  for (int32_t id : order) {
    std::string_view bytes = trie->token_bytes_[id];
    size_t common = 0;
    while (common < previous.size() && common < bytes.size() && previous[common] == bytes[common]) {
      ++common;
    }
    // Close the nodes deeper than the shared prefix.
    while (path.size() > common + 1) {
      nodes[path.back()].subtree_end = static_cast<int32_t>(nodes.size());
      path.pop_back();
    }
    for (size_t depth = common; depth < bytes.size(); ++depth) {
      Node node;
      node.byte = static_cast<uint8_t>(bytes[depth]);
      node.depth = static_cast<int32_t>(depth + 1);
      node.first_token = static_cast<int32_t>(trie->tokens_.size());
      nodes.push_back(node);
      path.push_back(static_cast<int32_t>(nodes.size() - 1));
    }
    Node& end = nodes[path.back()];
    if (end.num_tokens == 0) end.first_token = static_cast<int32_t>(trie->tokens_.size());
    trie->tokens_.push_back(id);
    ++end.num_tokens;
    trie->max_depth_ = std::max<int32_t>(trie->max_depth_, static_cast<int32_t>(bytes.size()));
    previous = bytes;
  }
  while (!path.empty()) {
    nodes[path.back()].subtree_end = static_cast<int32_t>(nodes.size());
    path.pop_back();
  }
  return trie;
}

absl::StatusOr<std::unique_ptr<TokenTrie>> TokenTrie::FromTokenizer(
    const Tokenizer& tokenizer, int64_t vocab_size, std::vector<int32_t> eos_token_ids) {
  const int32_t num_tokens = tokenizer.vocab_size();
  // Byte-level BPE writes a space as 'Ġ', SentencePiece as '▁': the more common one decides.
  int64_t byte_level_votes = 0;
  int64_t sentencepiece_votes = 0;
  for (int32_t id = 0; id < num_tokens; ++id) {
    std::string_view piece = tokenizer.IdToPiece(id);
    if (piece.find(kByteLevelSpace) != std::string_view::npos) ++byte_level_votes;
    if (piece.find(kSentencePieceSpace) != std::string_view::npos) ++sentencepiece_votes;
  }
  const bool byte_level = byte_level_votes > sentencepiece_votes;
  const std::vector<int32_t> inverse = ByteLevelInverse();
  std::vector<std::string> token_bytes(static_cast<size_t>(num_tokens));
  std::vector<uint8_t> excluded(static_cast<size_t>(num_tokens), 0);
  for (int32_t id = 0; id < num_tokens; ++id) {
    const std::string_view piece = tokenizer.IdToPiece(id);
    if (piece.empty() || tokenizer.IsSpecial(id)) {
      excluded[id] = 1;
      continue;
    }
    if (tokenizer.IsByteFallback(id)) {
      std::optional<uint8_t> byte = ByteFallbackByte(piece);
      if (!byte.has_value()) {
        return absl::InvalidArgumentError(
            StrCat("token ", id, " is a byte-fallback token without a <0xXX> piece"));
      }
      token_bytes[id] = std::string(1, static_cast<char>(*byte));
      continue;
    }
    if (byte_level) {
      std::optional<std::string> bytes = ByteLevelBytes(piece, inverse);
      // An added token that is not byte-mapped is its own text.
      token_bytes[id] = bytes.has_value() ? *std::move(bytes) : std::string(piece);
    } else {
      std::string text(piece);
      for (size_t at = text.find(kSentencePieceSpace); at != std::string::npos;
           at = text.find(kSentencePieceSpace, at + 1)) {
        text.replace(at, kSentencePieceSpace.size(), " ");
      }
      token_bytes[id] = std::move(text);
    }
  }
  return FromBytes(token_bytes, excluded, vocab_size, std::move(eos_token_ids));
}

}  // namespace lmserve::engine::structured
