#include "engine/core/state_slots.h"

#include "engine/core/check.h"

namespace lmserve::engine {

StateSlotPool::StateSlotPool(int32_t num_slots) : num_slots_(num_slots) {
  LMSERVE_CORE_CHECK(num_slots >= 0, "a pool of ", num_slots, " state slots");
  for (int32_t slot = num_slots - 1; slot >= 0; --slot) free_.push_back(slot);
}

std::optional<int32_t> StateSlotPool::Allocate(int64_t seq) {
  if (!enabled()) return -1;
  if (auto it = slots_.find(seq); it != slots_.end()) return it->second;
  if (free_.empty()) return std::nullopt;
  const int32_t slot = free_.back();
  free_.pop_back();
  slots_.emplace(seq, slot);
  return slot;
}

void StateSlotPool::Free(int64_t seq) {
  auto it = slots_.find(seq);
  if (it == slots_.end()) return;
  free_.push_back(it->second);
  // Keep the lowest id on top, so that slot ids are reused in a fixed order (exact tests).
  for (size_t i = free_.size() - 1; i > 0 && free_[i] > free_[i - 1]; --i) {
    std::swap(free_[i], free_[i - 1]);
  }
  slots_.erase(it);
}

int32_t StateSlotPool::SlotOf(int64_t seq) const {
  auto it = slots_.find(seq);
  return it == slots_.end() ? -1 : it->second;
}

}  // namespace lmserve::engine
