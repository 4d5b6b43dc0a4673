// The recurrent-state slots of a model with state-space layers (Mamba-2; model_runner.h's
// ModelRunner::num_state_slots), managed beside the KV blocks.
//
// Theory. A state-space layer keeps per sequence a state of fixed size (its conv window and SSM
// state), not per token: a running sequence holds one slot of a fixed pool, sized by the runner
// at start-up, from its admission to its end or preemption; the runner updates the slot in place
// each step. A slot's state is the sequence's after its computed tokens, so it cannot be shared
// (no prefix caching, no prompt sharing between samples) and preemption (recompute from position
// 0) simply frees it: the runner starts a sequence whose step begins at position 0 from zero
// state, whatever the slot held.
//
// "Does not fit" is not an error: Allocate returns nullopt and the scheduler does not admit.
// Thread safety: none; engine thread only.

#ifndef LMSERVE_ENGINE_CORE_STATE_SLOTS_H_
#define LMSERVE_ENGINE_CORE_STATE_SLOTS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace lmserve::engine {

class StateSlotPool {
 public:
  // A pool of slots [0, num_slots). num_slots 0: a model without state (Allocate never fails).
  explicit StateSlotPool(int32_t num_slots);

  StateSlotPool(const StateSlotPool&) = delete;
  StateSlotPool& operator=(const StateSlotPool&) = delete;

  bool enabled() const { return num_slots_ > 0; }
  int32_t num_slots() const { return num_slots_; }
  int32_t num_used() const { return static_cast<int32_t>(slots_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }

  // `seq`'s slot, taking the lowest free one if it holds none; nullopt when none is free (and
  // always -1 in a disabled pool, where nothing is counted).
  std::optional<int32_t> Allocate(int64_t seq);
  // Returns `seq`'s slot to the pool; a no-op when it holds none.
  void Free(int64_t seq);
  // `seq`'s slot; -1 when it holds none.
  int32_t SlotOf(int64_t seq) const;

 private:
  const int32_t num_slots_;
  std::vector<int32_t> free_;  // a stack, lowest id on top
  absl::flat_hash_map<int64_t, int32_t> slots_;
};

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_CORE_STATE_SLOTS_H_
