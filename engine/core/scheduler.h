// The scheduler: which sequences compute which tokens in the next engine step.
//
// Theory (vLLM v1). A sequence knows some tokens (its prompt, then each token sampled for it) and
// has computed the KV of some prefix of them (num_computed_tokens). There are no prefill or decode
// phases: each step, every running sequence is given the tokens it still lacks,
//     num_new_tokens = min(num_known - num_computed, per-sequence cap, tokens left in the budget),
// under a per-step token budget (max_num_batched_tokens) and a sequence limit (max_num_seqs). A new
// prompt is thus prefilled in chunks, between the single tokens of running decodes; a prefix-cache
// hit just starts num_computed above zero; preemption resets it to zero (recompute).
//
// One step:
//  1. Running sequences, in admission order, each get their tokens and the KV blocks to hold them
//     (in every KV cache group; a windowed group first drops the blocks that slid out of its
//     window, block_manager.h). When blocks run out, the running sequence with the lowest priority
//     and latest arrival (the greatest SeqKey) is preempted: its blocks are freed,
//     num_computed_tokens = 0, and it returns to the waiting queue (it may be the sequence asking,
//     which then gets nothing this step).
//  2. If nobody was preempted, waiting sequences are admitted in SeqKey order (priority, then
//     arrival) while the budget, max_num_seqs, the blocks and (for a model with state-space
//     layers) the state slots allow (state_slots.h). Admission looks the sequence's
//     full blocks up in the prefix cache (and, for samples 1..n-1 of a request, takes sample 0's
//     prompt blocks) and never takes from other sequences: the first that does not fit stops it.
//
// Guarantees. The best-keyed running sequence is never preempted for another, so it always
// progresses; a sequence that fits in the whole pool alone (checked at submission) therefore always
// completes. Every sequence scheduled in a step has num_new_tokens >= 1; a running sequence always
// lacks at least one token (the engine samples one whenever it catches up).
//
// Invariants: each sequence is in exactly one of waiting_ and running_, or in neither once removed;
// a waiting sequence holds no blocks and has num_computed_tokens == 0; a running one holds blocks
// for at least num_computed_tokens positions. Thread safety: none; engine thread only.

#ifndef LMSERVE_ENGINE_CORE_SCHEDULER_H_
#define LMSERVE_ENGINE_CORE_SCHEDULER_H_

#include <climits>
#include <cstdint>
#include <set>
#include <vector>

#include "engine/core/block_manager.h"
#include "engine/core/request.h"
#include "engine/core/state_slots.h"

namespace lmserve::engine {

// A sequence's lifecycle: kWaiting -> kRunning -> (kPreempted -> kRunning)* -> kRemoved (finished
// or aborted, from any state). kWaiting and kPreempted sequences sit in the waiting queue.
enum class SequenceState : uint8_t { kWaiting, kRunning, kPreempted, kRemoved };

// The scheduler's view of one sample of one request. Owned by the engine, which must Remove it from
// the scheduler before destroying it.
struct Sequence {
  int64_t seq_id = 0;  // unique; the block manager's key
  RequestId request_id = 0;
  int32_t sample_index = 0;
  int32_t priority = 0;       // lower first
  int64_t arrival_order = 0;  // earlier first, among equal priorities
  int32_t num_prompt_tokens = 0;
  std::vector<int32_t> tokens;  // known tokens: the prompt, then the generated ones
  // Sample 0 of the same request, for samples 1..n-1: its computed prompt blocks are shared at
  // admission, and this sequence waits while sample 0's prompt is still being computed.
  const Sequence* prompt_source = nullptr;
  // False while the engine still needs logits for every prompt position (prompt logprobs): a cache
  // hit would skip them.
  bool use_prefix_cache = true;
  // > 0: this sequence computes at most this many tokens a step (the engine bounds the logits rows
  // of prompt logprobs so). 0: no cap of its own.
  int32_t max_tokens_per_step = 0;

  // Scheduler state.
  SequenceState state = SequenceState::kWaiting;
  int32_t num_computed_tokens = 0;
  std::vector<uint64_t> block_hashes;  // chained hashes of the full blocks of `tokens`
  int32_t num_preemptions = 0;
  bool admitted_before = false;
  int32_t num_cached_tokens_at_first_admission = 0;

  // Async scheduling (EngineConfig::async_scheduling): tokens drawn by launched steps that the
  // engine has not read yet. They follow `tokens` (known, as their values are on the device).
  int32_t num_pending_tokens = 0;
  // A launched step draws this sequence's last token (its length limit): the scheduler leaves it
  // out until the engine has read that token and finished it.
  bool awaiting_last_token = false;

  int32_t num_known_tokens() const {
    return static_cast<int32_t>(tokens.size()) + num_pending_tokens;
  }
  int32_t num_output_tokens() const { return num_known_tokens() - num_prompt_tokens; }
  // Known tokens whose values the host has: `tokens`.
  int32_t num_read_tokens() const { return static_cast<int32_t>(tokens.size()); }
};

struct SchedulerConfig {
  int32_t max_num_seqs = 64;                 // running sequences at most
  int32_t max_num_batched_tokens = 2048;     // tokens computed per step at most
  int32_t long_prefill_token_threshold = 0;  // tokens per sequence per step at most; 0: no cap
};

struct ScheduledSequence {
  Sequence* seq = nullptr;
  int32_t num_new_tokens = 0;  // computes tokens[num_computed_tokens, num_computed_tokens + this)
};

struct SchedulerOutput {
  std::vector<ScheduledSequence> scheduled;  // in batch order
  std::vector<Sequence*> preempted;          // preempted during this step's scheduling
  std::vector<Sequence*> admitted;           // admitted from waiting this step
  int32_t num_batched_tokens = 0;
};

class Scheduler {
 public:
  // `state_slots`: the recurrent-state slots of a model with state-space layers (not owned; null
  // or disabled: none). With slots, a sequence holds one while it runs, preemption and removal
  // free it, and no sequence starts from another's blocks (prefix cache or prompt sharing): its
  // state would not be there.
  Scheduler(const SchedulerConfig& config, BlockManager* block_manager,
            StateSlotPool* state_slots = nullptr);

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a new sequence. REQUIRES: state kWaiting, no blocks, unique seq_id and (arrival_order,
  // sample_index).
  void AddWaiting(Sequence* seq);

  // Plans the next step (see the header comment). Allocates blocks for what it schedules.
  // `prefill_budget` bounds the tokens of the step's prefilling sequences (those lacking more
  // than one token: new prompts, chunks, recomputes after preemption) beside the token budget;
  // decoding sequences (one token lacking) do not draw on it, so the engine can keep a step short
  // while sequences decode. A prefilling sequence it leaves no token for waits for the next step.
  SchedulerOutput Schedule(int32_t prefill_budget = kNoPrefillBudget);
  static constexpr int32_t kNoPrefillBudget = INT32_MAX;

  // The runner computed `output`: advances each scheduled sequence's num_computed_tokens and
  // enters its newly full blocks into the prefix cache.
  void OnStepComputed(const SchedulerOutput& output);

  // Takes `seq` out of the scheduler wherever it is and frees its blocks (finish or abort).
  void Remove(Sequence* seq);

  bool HasWork() const { return !running_.empty() || !waiting_.empty(); }
  const std::vector<Sequence*>& running() const { return running_; }
  std::vector<Sequence*> waiting() const { return {waiting_.begin(), waiting_.end()}; }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }  // preempted too
  int32_t num_preempted() const { return num_preempted_waiting_; }  // waiting after a preemption

  // Statistics since construction.
  int64_t prefix_cache_queried_tokens() const { return prefix_cache_queried_tokens_; }
  int64_t prefix_cache_hit_tokens() const { return prefix_cache_hit_tokens_; }
  int64_t num_preemptions() const { return num_preemptions_; }

 private:
  // Orders by (priority, arrival_order, sample_index): the first is served first, the last
  // preempted first.
  struct SeqKeyLess {
    bool operator()(const Sequence* a, const Sequence* b) const;
  };

  void Preempt(Sequence* seq);
  // The blocks a waiting sequence can start from (cache hits or sample 0's prompt blocks).
  ComputedPrefix FindComputedPrefix(Sequence* seq);
  bool WaitsForPromptSource(const Sequence* seq) const;
  // The tokens `seq` may compute of the `num_tokens` it lacks, under the step's budgets.
  int32_t CapTokens(const Sequence& seq, int32_t num_tokens, int32_t budget,
                    int32_t prefill_budget) const;

  const SchedulerConfig config_;
  BlockManager* const block_manager_;  // not owned
  StateSlotPool* const state_slots_;   // not owned; null or disabled: no state slots
  std::vector<Sequence*> running_;     // in admission order
  std::set<Sequence*, SeqKeyLess> waiting_;
  int64_t prefix_cache_queried_tokens_ = 0;
  int64_t prefix_cache_hit_tokens_ = 0;
  int64_t num_preemptions_ = 0;
  int32_t num_preempted_waiting_ = 0;
};

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_CORE_SCHEDULER_H_
