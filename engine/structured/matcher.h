// Matching a Grammar (grammar.h) byte by byte, and the vocabulary bitmask of a state.
//
// Theory. The matcher is a nondeterministic pushdown automaton in the style of llama.cpp's grammar
// stacks: a stack holds grammar positions (the top is the next element to match, the frames below
// are where to continue when a rule ends), and a state is the set of stacks that the input so far
// allows. Stacks are interned as nodes (position, parent node) of one pool, so a stack is one
// integer and a state a sorted vector of them; a tail reference pushes nothing, so repetition and
// right recursion never deepen a stack. Advancing a state by a byte is the union of per-stack
// advances, each memoized by (stack, byte), so that the token-trie walk of one step reuses the
// work of every earlier walk of the same grammar.
//
// The mask of a state: the trie (token_trie.h) is walked in preorder with one state per depth; a
// byte that empties the state skips the node's whole subtree. The walk runs on a lazily built DFA
// over states: each state met is interned with a 256-entry transition row filled on first use, so
// a trie node costs one table read once the rows it needs exist (a cold walk of a string's
// content state fills a handful of rows); a generated token advances its matcher through the same
// rows (GrammarMatcher::AcceptToken), one lock a token. A token is allowed when its bytes
// leave a non-empty state; EOS only when the state accepts (some stack is empty). Masks are cached
// by state: JSON spends most of its tokens in a few states (inside a string, between values).
//
// Bounds: at most kMaxStacksPerState stacks in a state and kMaxPoolNodes interned stacks per
// grammar, kMaxStackDepth frames in a stack (deeper nesting is not allowed, as if the grammar
// ended there). Exceeding the pool or state bound makes the matcher fail (Failed()), which ends
// the request with an error rather than the engine's memory.
//
// Thread safety: CompiledGrammar is shared by the requests that ask for the same constraint; its
// memo tables are guarded by one mutex. A GrammarMatcher belongs to one sequence and one thread.

#ifndef LMSERVE_ENGINE_STRUCTURED_MATCHER_H_
#define LMSERVE_ENGINE_STRUCTURED_MATCHER_H_

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "engine/structured/grammar.h"
#include "engine/structured/token_trie.h"

namespace lmserve::engine::structured {

inline constexpr int32_t kMaxStacksPerState = 4096;
inline constexpr int32_t kMaxPoolNodes = 4'000'000;
inline constexpr int32_t kMaxStackDepth = 512;

// A sorted set of interned stacks. kAccept (0) is the empty stack: the grammar may end here.
using State = std::vector<int32_t>;
inline constexpr int32_t kAccept = 0;

class CompiledGrammar {
 public:
  // `trie` must outlive the grammar. `description` names it in errors and logs.
  CompiledGrammar(Grammar grammar, const TokenTrie* trie, std::string description);

  const Grammar& grammar() const { return grammar_; }
  const TokenTrie& trie() const { return *trie_; }
  const std::string& description() const { return description_; }

  // A state's id in the lazy DFA, as a matcher keeps it beside the state so that its next
  // advance and mask skip the state's lookup (hashing it): valid while `generation` is the DFA's
  // (the tables restart when full); id < 0: none.
  struct DfaRef {
    int32_t id = -1;
    uint64_t generation = 0;
  };

  // The state before any byte. Empty when the pool bound is exceeded.
  State Initial();
  // The state after `byte`; empty when the byte is not allowed (or a bound is exceeded: `failed`).
  void Advance(const State& state, uint8_t byte, State* out, bool* failed);
  // The state after `bytes` (a token's), through the lazy DFA that the mask walks fill, under one
  // lock: a token the last mask allowed costs a table read per byte. Empty as Advance.
  // `ref`: the state's DfaRef, if known; returns out's (none when out is empty).
  DfaRef AdvanceBytes(const State& state, DfaRef ref, std::string_view bytes, State* out,
                      bool* failed);
  void AdvanceBytes(const State& state, std::string_view bytes, State* out, bool* failed) {
    AdvanceBytes(state, DfaRef{}, bytes, out, failed);
  }
  // Fills `mask` ([trie().mask_words()] words; bit t of word t / 32 for token t) for `state`.
  // `ref`: the state's DfaRef, if known; updated to it.
  void FillMask(const State& state, DfaRef* ref, std::span<uint32_t> mask, bool* failed);
  void FillMask(const State& state, std::span<uint32_t> mask, bool* failed) {
    DfaRef ref;
    FillMask(state, &ref, mask, failed);
  }

  // Work counters, for tests and benchmarks.
  int64_t num_pool_nodes();
  int64_t num_mask_walks();  // masks computed by walking the trie (not from the cache)

 private:
  struct Node {
    int32_t pos;     // position in grammar_.code
    int32_t parent;  // node below; kAccept at the bottom
    int32_t depth;
  };

  int32_t Intern(int32_t pos, int32_t parent) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds to `out` the stacks reachable from `node` without consuming a byte whose top is a byte
  // set (or kAccept).
  void Close(int32_t node, std::vector<int32_t>* out, bool* failed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The memoized advance of one stack by one byte: a span of stacks_.
  std::span<const int32_t> AdvanceNode(int32_t node, uint8_t byte, bool* failed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdvanceLocked(const State& state, uint8_t byte, State* out, bool* failed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The lazy DFA: the id of `state`, and the id after a byte (kDead: none).
  int32_t InternState(const State& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `state`'s id: ref's where it is of this generation, else interned.
  int32_t Resolve(const State& state, DfaRef ref) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int32_t DfaStep(int32_t dstate, uint8_t byte, bool* failed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the DFA's tables when they hold more than kMaxDfaStates states.
  void ResetDfaIfFull() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Grammar grammar_;
  const TokenTrie* const trie_;
  const std::string description_;

  absl::Mutex mu_;
  std::vector<Node> nodes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, int32_t> node_ids_ ABSL_GUARDED_BY(mu_);
  // (node << 8 | byte) -> [offset, count) in advance_results_.
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> advance_memo_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> advance_results_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::vector<uint32_t>> mask_cache_ ABSL_GUARDED_BY(mu_);
  static constexpr int32_t kDead = -1;
  static constexpr int32_t kUnknown = -2;
  std::vector<State> dfa_states_ ABSL_GUARDED_BY(mu_);
  std::vector<std::array<int32_t, 256>> dfa_next_ ABSL_GUARDED_BY(mu_);
  std::vector<uint8_t> dfa_accept_only_ ABSL_GUARDED_BY(mu_);  // the state is {kAccept}
  // Per DFA state, its mask in mask_cache_ (a vector's data, stable until the cache is cleared),
  // or null: a cached mask found without hashing the state.
  std::vector<const uint32_t*> dfa_mask_ ABSL_GUARDED_BY(mu_);
  uint64_t dfa_generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped when the tables restart
  absl::flat_hash_map<std::string, int32_t> dfa_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> walk_states_ ABSL_GUARDED_BY(mu_);  // DFA state per trie depth
  State scratch_state_ ABSL_GUARDED_BY(mu_);
  std::vector<int32_t> closure_work_ ABSL_GUARDED_BY(mu_);
  int64_t num_mask_walks_ ABSL_GUARDED_BY(mu_) = 0;
};

// One sequence's position in a CompiledGrammar.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<CompiledGrammar> grammar);

  // Consumes a generated token. False when the grammar does not allow it (the state is kept).
  // An EOS token is allowed only where the grammar may end; it ends the matcher.
  bool AcceptToken(int32_t token_id);
  // Consumes bytes (tests; forced text). False when not allowed (the state is kept).
  bool AcceptBytes(std::string_view bytes);
  // The allowed tokens of the next step, as a bitmask of trie().mask_words() words.
  void FillMask(std::span<uint32_t> mask);

  bool CanEnd() const;      // the grammar accepts what was consumed
  bool MustEnd() const;     // ... and allows no further byte
  bool Failed() const { return failed_; }  // a bound was exceeded (matcher.h's theory)
  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  std::shared_ptr<CompiledGrammar> grammar_;
  State state_;
  CompiledGrammar::DfaRef dfa_;  // state_'s, where known
  State scratch_;
  bool ended_ = false;
  bool failed_ = false;
};

}  // namespace lmserve::engine::structured

#endif  // LMSERVE_ENGINE_STRUCTURED_MATCHER_H_
