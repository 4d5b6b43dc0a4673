#include "engine/core/scheduler.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "engine/core/check.h"

namespace lmserve::engine {

bool Scheduler::SeqKeyLess::operator()(const Sequence* a, const Sequence* b) const {
  return std::tie(a->priority, a->arrival_order, a->sample_index) <
         std::tie(b->priority, b->arrival_order, b->sample_index);
}

Scheduler::Scheduler(const SchedulerConfig& config, BlockManager* block_manager,
                     StateSlotPool* state_slots)
    : config_(config),
      block_manager_(block_manager),
      state_slots_(state_slots != nullptr && state_slots->enabled() ? state_slots : nullptr) {
  LMSERVE_CORE_CHECK(config.max_num_seqs > 0, "max_num_seqs ", config.max_num_seqs);
  LMSERVE_CORE_CHECK(config.max_num_batched_tokens > 0, "max_num_batched_tokens ",
                     config.max_num_batched_tokens);
}

void Scheduler::AddWaiting(Sequence* seq) {
  LMSERVE_CORE_CHECK(seq->state == SequenceState::kWaiting && seq->num_computed_tokens == 0, "seq ",
                     seq->seq_id, " is not a fresh waiting sequence");
  LMSERVE_CORE_CHECK(seq->num_known_tokens() > 0, "seq ", seq->seq_id, " has no tokens");
  LMSERVE_CORE_CHECK(waiting_.insert(seq).second, "seq ", seq->seq_id, " queued twice");
}

int32_t Scheduler::CapTokens(const Sequence& seq, int32_t num_tokens, int32_t budget,
                             int32_t prefill_budget) const {
  const bool prefilling = num_tokens > 1;
  num_tokens = std::min(num_tokens, budget);
  if (config_.long_prefill_token_threshold > 0) {
    num_tokens = std::min(num_tokens, config_.long_prefill_token_threshold);
  }
  if (seq.max_tokens_per_step > 0) num_tokens = std::min(num_tokens, seq.max_tokens_per_step);
  if (prefilling) num_tokens = std::min(num_tokens, std::max(prefill_budget, 0));
  return num_tokens;
}

SchedulerOutput Scheduler::Schedule(int32_t prefill_budget) {
  SchedulerOutput out;
  int32_t budget = config_.max_num_batched_tokens;
  // Whether a sequence draws on prefill_budget (as CapTokens counts it).
  auto is_prefill = [](const Sequence* seq) {
    return seq->num_known_tokens() - seq->num_computed_tokens > 1;
  };

  // 1. Running sequences, in admission order.
  size_t index = 0;
  while (index < running_.size() && budget > 0) {
    Sequence* seq = running_[index];
    if (seq->awaiting_last_token) {  // its last token is drawn already, in a launched step
      ++index;
      continue;
    }
    const int32_t num_lacking = seq->num_known_tokens() - seq->num_computed_tokens;
    LMSERVE_CORE_CHECK(num_lacking > 0, "running seq ", seq->seq_id, " lacks no token");
    const int32_t num_new = CapTokens(*seq, num_lacking, budget, prefill_budget);
    if (num_new == 0) {  // the prefill budget is spent: this chunk waits for the next step
      ++index;
      continue;
    }
    bool allocated = false;
    while (true) {
      if (block_manager_->Allocate(seq->seq_id, int64_t{seq->num_computed_tokens} + num_new, {},
                                   seq->num_computed_tokens)) {
        allocated = true;
        break;
      }
      // Out of blocks: preempt the lowest-priority, latest running sequence.
      auto victim_it = std::max_element(running_.begin(), running_.end(), SeqKeyLess());
      Sequence* victim = *victim_it;
      const size_t victim_index = static_cast<size_t>(victim_it - running_.begin());
      auto planned = std::find_if(out.scheduled.begin(), out.scheduled.end(),
                                  [victim](const ScheduledSequence& s) { return s.seq == victim; });
      if (planned != out.scheduled.end()) {
        budget += planned->num_new_tokens;
        if (is_prefill(victim)) prefill_budget += planned->num_new_tokens;
        out.scheduled.erase(planned);
      }
      Preempt(victim);
      out.preempted.push_back(victim);
      if (victim == seq) break;
      if (victim_index < index) --index;
    }
    if (allocated) {
      out.scheduled.push_back({seq, num_new});
      budget -= num_new;
      if (num_lacking > 1) prefill_budget -= num_new;
      ++index;
    }
  }

  // 2. Admission, in (priority, arrival) order, unless this step had to preempt. A sequence that
  // only awaits its last token (drawn by a launched step) gives its seat up already: it is in no
  // step from now on, and its blocks go back once that token is read.
  if (out.preempted.empty()) {
    const auto num_awaiting = static_cast<int32_t>(std::count_if(
        running_.begin(), running_.end(), [](const Sequence* s) { return s->awaiting_last_token; }));
    auto it = waiting_.begin();
    while (it != waiting_.end() && budget > 0 &&
           static_cast<int32_t>(running_.size()) - num_awaiting < config_.max_num_seqs) {
      Sequence* seq = *it;
      // Preempted with a token a launched step draws: recomputed once the engine has read it.
      if (WaitsForPromptSource(seq) || seq->num_pending_tokens > 0 || seq->awaiting_last_token) {
        ++it;
        continue;
      }
      const ComputedPrefix prefix = FindComputedPrefix(seq);
      const int32_t num_computed = prefix.num_blocks * block_manager_->block_size_tokens();
      const int32_t num_lacking = seq->num_known_tokens() - num_computed;
      const int32_t num_new = CapTokens(*seq, num_lacking, budget, prefill_budget);
      if (num_new == 0) break;  // the prefill budget is spent
      if (state_slots_ != nullptr && state_slots_->num_free() == 0) break;
      if (!block_manager_->Allocate(seq->seq_id, int64_t{num_computed} + num_new, prefix,
                                    num_computed)) {
        break;
      }
      if (state_slots_ != nullptr) {
        LMSERVE_CORE_CHECK(state_slots_->Allocate(seq->seq_id).has_value(), "seq ", seq->seq_id,
                           " found no free state slot");
      }
      it = waiting_.erase(it);
      if (seq->state == SequenceState::kPreempted) --num_preempted_waiting_;
      const bool looked_up = (seq->use_prefix_cache && block_manager_->prefix_caching_enabled()) ||
                             seq->prompt_source != nullptr;
      if (looked_up) {
        prefix_cache_queried_tokens_ += seq->num_known_tokens();
        prefix_cache_hit_tokens_ += num_computed;
      }
      if (!seq->admitted_before) {
        seq->admitted_before = true;
        seq->num_cached_tokens_at_first_admission = num_computed;
      }
      seq->num_computed_tokens = num_computed;
      seq->state = SequenceState::kRunning;
      running_.push_back(seq);
      out.scheduled.push_back({seq, num_new});
      out.admitted.push_back(seq);
      budget -= num_new;
      if (num_lacking > 1) prefill_budget -= num_new;
    }
  }

  out.num_batched_tokens = config_.max_num_batched_tokens - budget;
  return out;
}

void Scheduler::OnStepComputed(const SchedulerOutput& output) {
  for (const ScheduledSequence& scheduled : output.scheduled) {
    Sequence* seq = scheduled.seq;
    LMSERVE_CORE_CHECK(seq->state == SequenceState::kRunning, "seq ", seq->seq_id,
                       " computed but not running");
    seq->num_computed_tokens += scheduled.num_new_tokens;
    LMSERVE_CORE_CHECK(seq->num_computed_tokens <= seq->num_known_tokens(), "seq ", seq->seq_id,
                       " computed beyond its known tokens");
    if (block_manager_->prefix_caching_enabled()) {
      block_manager_->ExtendBlockHashes(seq->tokens, &seq->block_hashes);
      block_manager_->CacheComputedBlocks(seq->seq_id, seq->block_hashes, seq->num_computed_tokens);
    }
  }
}

void Scheduler::Remove(Sequence* seq) {
  if (seq->state == SequenceState::kRunning) {
    auto it = std::find(running_.begin(), running_.end(), seq);
    LMSERVE_CORE_CHECK(it != running_.end(), "running seq ", seq->seq_id, " not in running_");
    running_.erase(it);
  } else if (seq->state == SequenceState::kWaiting || seq->state == SequenceState::kPreempted) {
    LMSERVE_CORE_CHECK(waiting_.erase(seq) == 1, "waiting seq ", seq->seq_id, " not in waiting_");
    if (seq->state == SequenceState::kPreempted) --num_preempted_waiting_;
  }
  block_manager_->Free(seq->seq_id);
  if (state_slots_ != nullptr) state_slots_->Free(seq->seq_id);
  seq->state = SequenceState::kRemoved;
}

void Scheduler::Preempt(Sequence* seq) {
  auto it = std::find(running_.begin(), running_.end(), seq);
  LMSERVE_CORE_CHECK(it != running_.end(), "preempting seq ", seq->seq_id, " not running");
  running_.erase(it);
  block_manager_->Free(seq->seq_id);
  if (state_slots_ != nullptr) state_slots_->Free(seq->seq_id);
  seq->num_computed_tokens = 0;
  seq->state = SequenceState::kPreempted;
  ++num_preempted_waiting_;
  ++seq->num_preemptions;
  ++num_preemptions_;
  waiting_.insert(seq);
}

bool Scheduler::WaitsForPromptSource(const Sequence* seq) const {
  const Sequence* source = seq->prompt_source;
  if (state_slots_ != nullptr) return false;  // no prompt sharing: each computes its own state
  return source != nullptr && source->state != SequenceState::kRemoved &&
         source->num_computed_tokens < seq->num_prompt_tokens;
}

ComputedPrefix Scheduler::FindComputedPrefix(Sequence* seq) {
  const int32_t block_size = block_manager_->block_size_tokens();
  // At least one token is left to compute: its logits pick the next token.
  const int32_t max_blocks = (seq->num_known_tokens() - 1) / block_size;
  ComputedPrefix prefix;
  // A sequence with recurrent state starts at position 0: its slot holds no other's state.
  if (state_slots_ != nullptr) return prefix;
  if (seq->use_prefix_cache && block_manager_->prefix_caching_enabled()) {
    block_manager_->ExtendBlockHashes(seq->tokens, &seq->block_hashes);
    prefix = block_manager_->FindCachedPrefix(seq->block_hashes, max_blocks);
  }
  const Sequence* source = seq->prompt_source;
  if (source != nullptr && source->state == SequenceState::kRunning) {
    const int32_t num_shareable = std::min(
        max_blocks, std::min(source->num_computed_tokens, seq->num_prompt_tokens) / block_size);
    if (num_shareable > prefix.num_blocks) {
      // Empty when the source's window has slid past what the shared prefix needs.
      ComputedPrefix shared = block_manager_->SharedPrefix(source->seq_id, num_shareable);
      if (shared.num_blocks > prefix.num_blocks) prefix = std::move(shared);
    }
  }
  return prefix;
}

}  // namespace lmserve::engine
