#include "engine/structured/matcher.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace lmserve::engine::structured {
namespace {

// Masks cached per grammar: about 6 KiB each for a 49,152-token vocabulary.
constexpr size_t kMaxCachedMasks = 1024;
// DFA states kept per grammar (1 KiB of transitions each); the tables restart beyond it.
constexpr size_t kMaxDfaStates = 16384;
constexpr size_t kMaxAdvanceMemo = 8'000'000;

std::string StateKey(const State& state) {
  return std::string(reinterpret_cast<const char*>(state.data()), state.size() * sizeof(int32_t));
}

}  // namespace

CompiledGrammar::CompiledGrammar(Grammar grammar, const TokenTrie* trie, std::string description)
    : grammar_(std::move(grammar)), trie_(trie), description_(std::move(description)) {
  absl::MutexLock lock(&mu_);
  nodes_.push_back({-1, -1, 0});  // kAccept
}

int32_t CompiledGrammar::Intern(int32_t pos, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) |
                       static_cast<uint32_t>(parent);
  auto [it, inserted] = node_ids_.try_emplace(key, static_cast<int32_t>(nodes_.size()));
  if (inserted) nodes_.push_back({pos, parent, nodes_[parent].depth + 1});
  return it->second;
}

void CompiledGrammar::Close(int32_t start, std::vector<int32_t>* out, bool* failed) {
  // Depth-first over the stacks reachable without a byte; a node seen twice is expanded once.
  std::vector<int32_t>& work = closure_work_;
  work.clear();
  work.push_back(start);
  std::vector<int32_t> seen;
  while (!work.empty()) {
    const int32_t node = work.back();
    work.pop_back();
    if (std::find(seen.begin(), seen.end(), node) != seen.end()) continue;
    seen.push_back(node);
    if (node == kAccept) {
      out->push_back(kAccept);
      continue;
    }
    const Node frame = nodes_[node];
    const int32_t code = grammar_.code[frame.pos];
    if (code >= 0) {
      out->push_back(node);
    } else if (code == Grammar::kEnd) {
      work.push_back(frame.parent);
    } else {
      const int32_t rule = Grammar::RuleOf(code);
      // A reference at the end of its alternative continues where the alternative's own caller
      // does: nothing is pushed (tail call).
      const int32_t continuation = grammar_.code[frame.pos + 1] == Grammar::kEnd
                                       ? frame.parent
                                       : Intern(frame.pos + 1, frame.parent);
      if (nodes_[continuation].depth >= kMaxStackDepth) continue;  // too deep: not allowed
      for (int32_t alternative : grammar_.rule_alternatives[rule]) {
        work.push_back(Intern(alternative, continuation));
      }
    }
    if (static_cast<int64_t>(nodes_.size()) > kMaxPoolNodes ||
        static_cast<int64_t>(seen.size()) > 4 * int64_t{kMaxStacksPerState}) {
      *failed = true;
      return;
    }
  }
}

std::span<const int32_t> CompiledGrammar::AdvanceNode(int32_t node, uint8_t byte, bool* failed) {
  if (node == kAccept) return {};
  const uint64_t key = (static_cast<uint64_t>(node) << 8) | byte;
  if (auto it = advance_memo_.find(key); it != advance_memo_.end()) {
    return std::span<const int32_t>(advance_results_).subspan(it->second.first, it->second.second);
  }
  if (advance_memo_.size() >= kMaxAdvanceMemo) {
    advance_memo_.clear();
    advance_results_.clear();
  }
  const Node frame = nodes_[node];
  std::vector<int32_t> next;
  if (grammar_.byte_sets[grammar_.code[frame.pos]].Has(byte)) {
    Close(Intern(frame.pos + 1, frame.parent), &next, failed);
    std::sort(next.begin(), next.end());
    next.erase(std::unique(next.begin(), next.end()), next.end());
  }
  const auto offset = static_cast<int32_t>(advance_results_.size());
  advance_results_.insert(advance_results_.end(), next.begin(), next.end());
  advance_memo_.emplace(key, std::make_pair(offset, static_cast<int32_t>(next.size())));
  return std::span<const int32_t>(advance_results_).subspan(offset, next.size());
}

State CompiledGrammar::Initial() {
  absl::MutexLock lock(&mu_);
  State state;
  bool failed = false;
  for (int32_t alternative : grammar_.rule_alternatives[grammar_.root]) {
    Close(Intern(alternative, kAccept), &state, &failed);
  }
  if (failed) return {};
  std::sort(state.begin(), state.end());
  state.erase(std::unique(state.begin(), state.end()), state.end());
  return state;
}

void CompiledGrammar::AdvanceLocked(const State& state, uint8_t byte, State* out, bool* failed) {
  out->clear();
  if (state.size() == 1) {
    std::span<const int32_t> next = AdvanceNode(state[0], byte, failed);
    out->assign(next.begin(), next.end());
    return;
  }
  for (int32_t node : state) {
    std::span<const int32_t> next = AdvanceNode(node, byte, failed);
    out->insert(out->end(), next.begin(), next.end());
  }
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
  if (static_cast<int32_t>(out->size()) > kMaxStacksPerState) {
    *failed = true;
    out->clear();
  }
}

int32_t CompiledGrammar::InternState(const State& state) {
  auto [it, inserted] = dfa_ids_.try_emplace(StateKey(state), 0);
  if (inserted) {
    it->second = static_cast<int32_t>(dfa_states_.size());
    dfa_states_.push_back(state);
    std::array<int32_t, 256> row;
    row.fill(kUnknown);
    dfa_next_.push_back(row);
    dfa_accept_only_.push_back(state.size() == 1 && state[0] == kAccept);
    dfa_mask_.push_back(nullptr);
  }
  return it->second;
}

int32_t CompiledGrammar::Resolve(const State& state, DfaRef ref) {
  if (ref.id >= 0 && ref.generation == dfa_generation_ &&
      static_cast<size_t>(ref.id) < dfa_states_.size()) {
    return ref.id;
  }
  return InternState(state);
}

int32_t CompiledGrammar::DfaStep(int32_t dstate, uint8_t byte, bool* failed) {
  int32_t next = dfa_next_[dstate][byte];
  if (next != kUnknown) return next;
  bool step_failed = false;
  AdvanceLocked(dfa_states_[dstate], byte, &scratch_state_, &step_failed);
  next = scratch_state_.empty() ? kDead : InternState(scratch_state_);
  // A bound exceeded is not cached as a dead end: each step that meets it says so.
  if (step_failed) {
    *failed = true;
    return kDead;
  }
  dfa_next_[dstate][byte] = next;
  return next;
}

void CompiledGrammar::ResetDfaIfFull() {
  if (dfa_states_.size() <= kMaxDfaStates) return;
  dfa_states_.clear();
  dfa_next_.clear();
  dfa_accept_only_.clear();
  dfa_mask_.clear();
  dfa_ids_.clear();
  ++dfa_generation_;
}

void CompiledGrammar::Advance(const State& state, uint8_t byte, State* out, bool* failed) {
  absl::MutexLock lock(&mu_);
  AdvanceLocked(state, byte, out, failed);
}

CompiledGrammar::DfaRef CompiledGrammar::AdvanceBytes(const State& state, DfaRef ref,
                                                      std::string_view bytes, State* out,
                                                      bool* failed) {
  absl::MutexLock lock(&mu_);
  out->clear();
  if (state.empty()) return {};
  ResetDfaIfFull();
  int32_t dstate = Resolve(state, ref);
  for (char c : bytes) {
    dstate = DfaStep(dstate, static_cast<uint8_t>(c), failed);
    if (dstate == kDead) return {};
  }
  *out = dfa_states_[static_cast<size_t>(dstate)];
  return {.id = dstate, .generation = dfa_generation_};
}

void CompiledGrammar::FillMask(const State& state, DfaRef* ref, std::span<uint32_t> mask,
                               bool* failed) {
  absl::MutexLock lock(&mu_);
  ResetDfaIfFull();
  const int32_t start = Resolve(state, *ref);
  *ref = {.id = start, .generation = dfa_generation_};
  if (const uint32_t* cached = dfa_mask_[static_cast<size_t>(start)]; cached != nullptr) {
    std::memcpy(mask.data(), cached, mask.size_bytes());
    return;
  }
  std::string key = StateKey(state);
  if (auto it = mask_cache_.find(key); it != mask_cache_.end()) {
    std::memcpy(mask.data(), it->second.data(), mask.size_bytes());
    dfa_mask_[static_cast<size_t>(start)] = it->second.data();
    return;
  }
  ++num_mask_walks_;
  std::fill(mask.begin(), mask.end(), 0u);
  const std::vector<TokenTrie::Node>& nodes = trie_->nodes();
  const std::vector<int32_t>& tokens = trie_->node_tokens();
  walk_states_.resize(static_cast<size_t>(trie_->max_depth()) + 1);
  walk_states_[0] = start;
  const auto num_nodes = static_cast<int32_t>(nodes.size());
  for (int32_t i = 1; i < num_nodes;) {
    const TokenTrie::Node& node = nodes[i];
    const int32_t next = DfaStep(walk_states_[node.depth - 1], node.byte, failed);
    walk_states_[node.depth] = next;
    if (next == kDead || dfa_accept_only_[next]) {
      // Nothing more can follow kAccept alone; tokens ending here are allowed when it is there.
      if (next != kDead) {
        for (int32_t k = 0; k < node.num_tokens; ++k) {
          const int32_t token = tokens[node.first_token + k];
          mask[token >> 5] |= uint32_t{1} << (token & 31);
        }
      }
      i = node.subtree_end;
      continue;
    }
    for (int32_t k = 0; k < node.num_tokens; ++k) {
      const int32_t token = tokens[node.first_token + k];
      mask[token >> 5] |= uint32_t{1} << (token & 31);
    }
    ++i;
  }
  if (!state.empty() && state[0] == kAccept) {
    for (int32_t eos : trie_->eos_token_ids()) {
      if (eos >= 0 && eos < trie_->vocab_size()) mask[eos >> 5] |= uint32_t{1} << (eos & 31);
    }
  }
  if (mask_cache_.size() >= kMaxCachedMasks) {
    mask_cache_.clear();
    std::fill(dfa_mask_.begin(), dfa_mask_.end(), nullptr);
  }
  const auto it =
      mask_cache_.emplace(std::move(key), std::vector<uint32_t>(mask.begin(), mask.end())).first;
  dfa_mask_[static_cast<size_t>(start)] = it->second.data();
}

int64_t CompiledGrammar::num_pool_nodes() {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(nodes_.size());
}

int64_t CompiledGrammar::num_mask_walks() {
  absl::MutexLock lock(&mu_);
  return num_mask_walks_;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<CompiledGrammar> grammar)
    : grammar_(std::move(grammar)), state_(grammar_->Initial()) {
  failed_ = state_.empty();
}

bool GrammarMatcher::AcceptBytes(std::string_view bytes) {
  if (ended_ || failed_) return false;
  if (bytes.empty()) return true;
  const CompiledGrammar::DfaRef next = grammar_->AdvanceBytes(state_, dfa_, bytes, &scratch_,
                                                              &failed_);
  if (failed_ || scratch_.empty()) return false;
  std::swap(state_, scratch_);
  dfa_ = next;
  return true;
}

bool GrammarMatcher::AcceptToken(int32_t token_id) {
  if (ended_ || failed_) return false;
  const TokenTrie& trie = grammar_->trie();
  const auto& eos = trie.eos_token_ids();
  if (std::find(eos.begin(), eos.end(), token_id) != eos.end()) {
    if (!CanEnd()) return false;
    ended_ = true;
    return true;
  }
  if (trie.Excluded(token_id)) return false;
  return AcceptBytes(trie.TokenBytes(token_id));
}

void GrammarMatcher::FillMask(std::span<uint32_t> mask) {
  if (ended_ || failed_) {
    std::fill(mask.begin(), mask.end(), 0u);
    return;
  }
  grammar_->FillMask(state_, &dfa_, mask, &failed_);
}

bool GrammarMatcher::CanEnd() const { return !state_.empty() && state_[0] == kAccept; }

bool GrammarMatcher::MustEnd() const { return state_.size() == 1 && state_[0] == kAccept; }

}  // namespace lmserve::engine::structured
