// State slots (engine/core/state_slots.h) and the scheduler's use of them, step by step: a pool
// of 2 slots admits 2 of 3 sequences however many the sequence limit allows; finishing,
// preemption and removal return slots, which are handed out lowest id first; no sequence starts
// from another's blocks.

#include "engine/core/state_slots.h"

#include <vector>

#include "engine/core/block_manager.h"
#include "engine/core/scheduler.h"
#include "gtest/gtest.h"

namespace lmserve::engine {
namespace {

TEST(StateSlotPoolTest, HandsOutTheLowestFreeSlotAndTakesItBack) {
  StateSlotPool pool(3);
  EXPECT_TRUE(pool.enabled());
  EXPECT_EQ(pool.Allocate(10), 0);
  EXPECT_EQ(pool.Allocate(11), 1);
  EXPECT_EQ(pool.Allocate(10), 0);  // already held
  EXPECT_EQ(pool.Allocate(12), 2);
  EXPECT_EQ(pool.Allocate(13), std::nullopt);
  EXPECT_EQ(pool.num_used(), 3);
  pool.Free(11);
  pool.Free(10);
  pool.Free(99);  // holds none: a no-op
  EXPECT_EQ(pool.SlotOf(10), -1);
  EXPECT_EQ(pool.SlotOf(12), 2);
  EXPECT_EQ(pool.Allocate(13), 0);
  EXPECT_EQ(pool.Allocate(14), 1);
  EXPECT_EQ(pool.num_free(), 0);
}

TEST(StateSlotPoolTest, AnEmptyPoolIsDisabled) {
  StateSlotPool pool(0);
  EXPECT_FALSE(pool.enabled());
  EXPECT_EQ(pool.Allocate(1), -1);
  EXPECT_EQ(pool.num_used(), 0);
  EXPECT_EQ(pool.SlotOf(1), -1);
}

Sequence MakeSequence(int64_t id, int32_t prompt_len) {
  Sequence seq;
  seq.seq_id = id;
  seq.request_id = id;
  seq.arrival_order = id;
  seq.num_prompt_tokens = prompt_len;
  for (int32_t i = 0; i < prompt_len; ++i) seq.tokens.push_back(i + 1);
  return seq;
}

std::vector<int64_t> Ids(const std::vector<ScheduledSequence>& scheduled) {
  std::vector<int64_t> ids;
  for (const ScheduledSequence& s : scheduled) ids.push_back(s.seq->seq_id);
  return ids;
}

TEST(StateSlotSchedulerTest, AdmissionCountsSlotsAndEveryExitFreesThem) {
  BlockManager blocks(/*num_blocks=*/64, /*block_size_tokens=*/4, /*enable_prefix_caching=*/false,
                      {0});
  StateSlotPool slots(2);
  Scheduler scheduler({.max_num_seqs = 8, .max_num_batched_tokens = 64}, &blocks, &slots);
  Sequence a = MakeSequence(1, 5), b = MakeSequence(2, 5), c = MakeSequence(3, 5);
  for (Sequence* seq : {&a, &b, &c}) scheduler.AddWaiting(seq);

  // Step 1: A and B take slots 0 and 1; C waits for a slot, though the sequence limit is 8.
  SchedulerOutput step = scheduler.Schedule();
  EXPECT_EQ(Ids(step.scheduled), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(slots.SlotOf(1), 0);
  EXPECT_EQ(slots.SlotOf(2), 1);
  EXPECT_EQ(scheduler.num_waiting(), 1);
  scheduler.OnStepComputed(step);

  // A finishes: its slot goes to C, which starts at position 0.
  scheduler.Remove(&a);
  EXPECT_EQ(slots.SlotOf(1), -1);
  a.tokens.push_back(9);  // (A is gone; B decodes one more token)
  b.tokens.push_back(9);
  step = scheduler.Schedule();
  EXPECT_EQ(Ids(step.scheduled), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(slots.SlotOf(3), 0);
  EXPECT_EQ(c.num_computed_tokens, 0);
  scheduler.OnStepComputed(step);

  // Removing a waiting or running sequence frees its slot; the pool is empty at the end.
  scheduler.Remove(&b);
  scheduler.Remove(&c);
  EXPECT_EQ(slots.num_used(), 0);
  EXPECT_FALSE(scheduler.HasWork());
}

TEST(StateSlotSchedulerTest, PreemptionFreesTheSlot) {
  // 3 blocks of 4 tokens: A (8 tokens) and B (4 tokens) fill them; B's next token needs a fourth
  // block, and B, the later, is preempted.
  BlockManager blocks(/*num_blocks=*/3, /*block_size_tokens=*/4, /*enable_prefix_caching=*/false,
                      {0});
  StateSlotPool slots(2);
  Scheduler scheduler({.max_num_seqs = 8, .max_num_batched_tokens = 64}, &blocks, &slots);
  Sequence a = MakeSequence(1, 8), b = MakeSequence(2, 4);
  scheduler.AddWaiting(&a);
  scheduler.AddWaiting(&b);
  SchedulerOutput step = scheduler.Schedule();
  EXPECT_EQ(Ids(step.scheduled), (std::vector<int64_t>{1, 2}));
  scheduler.OnStepComputed(step);
  b.tokens.push_back(7);
  a.tokens.push_back(7);
  step = scheduler.Schedule();
  ASSERT_EQ(step.preempted.size(), 1u);
  EXPECT_EQ(step.preempted[0], &b);
  EXPECT_EQ(slots.SlotOf(2), -1);
  EXPECT_EQ(slots.num_used(), 1);
  scheduler.Remove(&a);
  scheduler.Remove(&b);
  EXPECT_EQ(slots.num_used(), 0);
}

}  // namespace
}  // namespace lmserve::engine
