// A harness that drives an EngineCore over a FakeRunner a step at a time and describes each step in
// the words of the scheduler tables: what was scheduled, what runs, waits, holds which blocks.

#ifndef LMSERVE_TESTS_ENGINE_CORE_ENGINE_TEST_UTIL_H_
#define LMSERVE_TESTS_ENGINE_CORE_ENGINE_TEST_UTIL_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/hash.h"
#include "common/strings.h"
#include "engine/core/engine_core.h"
#include "gtest/gtest.h"
#include "tests/engine/core/fake_runner.h"

namespace lmserve::engine::testing {

// Everything one sample produced, assembled from its stream.
struct SampleResult {
  std::vector<int32_t> token_ids;
  std::string text;
  std::vector<PositionLogprobs> logprobs;
  std::vector<PositionLogprobs> prompt_logprobs;
  std::vector<double> token_times_seconds;
  int32_t num_finished_outputs = 0;
  std::optional<RequestOutput> final_output;  // the finished output
};

class CoreHarness {
 public:
  CoreHarness(FakeRunnerOptions runner_options, EngineConfig config,
              std::unique_ptr<TextDecoder> text_decoder = nullptr)
      : vocab_size_(runner_options.vocab_size) {
    runner_options.clock = &clock_;
    auto runner = std::make_unique<FakeRunner>(runner_options);
    runner_ = runner.get();
    config.clock = &clock_;
    auto core = EngineCore::Create(std::move(runner), config, std::move(text_decoder));
    EXPECT_TRUE(core.ok()) << core.status();
    core_ = *std::move(core);
  }

  EngineCore& core() { return *core_; }
  FakeRunner& runner() { return *runner_; }
  ManualClock& clock() { return clock_; }
  int64_t vocab_size() const { return vocab_size_; }

  // Adds a request named `name` (names appear in descriptions; samples of n > 1 as A0, A1, ...).
  RequestId Add(const std::string& name, Request request) {
    EXPECT_TRUE(core_->Validate(request).ok()) << core_->Validate(request);
    const RequestId id = next_id_++;
    names_[id] = name;
    auto stream = std::make_shared<OutputStream>(id, request.sampling.n);
    streams_[id] = stream;
    samples_[id].resize(static_cast<size_t>(request.sampling.n));
    core_->AddRequest(id, std::move(request), clock_.NowSeconds(), stream);
    return id;
  }

  // A greedy request that ignores EOS, so that it runs for exactly max_tokens; its prompt is
  // `prompt_len` tokens unique to `name`.
  RequestId AddGreedy(const std::string& name, int32_t prompt_len, int32_t max_tokens,
                      int32_t priority = 0) {
    Request request;
    request.prompt_token_ids = Prompt(name, prompt_len);
    request.sampling.temperature = 0.0;
    request.sampling.max_tokens = max_tokens;
    request.sampling.ignore_eos = true;
    request.priority = priority;
    return Add(name, std::move(request));
  }

  std::vector<int32_t> Prompt(const std::string& name, int32_t length) const {
    std::vector<int32_t> prompt;
    uint64_t state = 0;
    for (char c : name) state = Mix64(state ^ static_cast<uint8_t>(c));
    for (int32_t i = 0; i < length; ++i) {
      state = Mix64(state + static_cast<uint64_t>(i));
      prompt.push_back(1 + static_cast<int32_t>(state % static_cast<uint64_t>(vocab_size_ - 1)));
    }
    return prompt;
  }

  // Runs one step and collects the outputs. Returns Step()'s result.
  bool Step() {
    const bool ran = core_->Step();
    finished_this_step_.clear();
    Drain();
    core_->block_manager().CheckInvariants();
    return ran;
  }

  void Abort(RequestId id) {
    core_->Abort(id);
    finished_this_step_.clear();
    Drain();
    core_->block_manager().CheckInvariants();
  }

  void RunToCompletion(int32_t max_steps = 100000) {
    for (int32_t i = 0; i < max_steps && core_->HasWork(); ++i) Step();
    EXPECT_FALSE(core_->HasWork());
  }

  const SampleResult& result(RequestId id, int32_t sample_index = 0) {
    return samples_.at(id).at(static_cast<size_t>(sample_index));
  }
  const OutputStream& stream(RequestId id) { return *streams_.at(id); }

  // "A:8 B:1": the last step's scheduled sequences and their new tokens, in batch order.
  std::string Scheduled() const {
    std::vector<std::string> parts;
    for (const EngineCore::StepEntry& entry : core_->last_scheduled()) {
      parts.push_back(
          StrCat(SeqName(entry.request_id, entry.sample_index), ":", entry.num_new_tokens));
    }
    return StrJoin(parts, " ");
  }
  std::string Preempted() const {
    std::vector<std::string> parts;
    for (const EngineCore::StepEntry& entry : core_->last_preempted()) {
      parts.push_back(SeqName(entry.request_id, entry.sample_index));
    }
    return StrJoin(parts, " ");
  }
  std::string Running() const { return Names(core_->scheduler().running()); }
  std::string Waiting() const { return Names(core_->scheduler().waiting()); }
  // "A[0 1] B[2]": the running sequences' block tables; with several KV cache groups, each
  // group's table, "A[- 1 2 | 3 4 5]" ("-" a dropped entry).
  std::string Blocks() const {
    const BlockManager& manager = core_->block_manager();
    std::vector<std::string> parts;
    for (const Sequence* seq : core_->scheduler().running()) {
      std::vector<std::string> groups;
      for (int32_t g = 0; g < manager.num_groups(); ++g) {
        std::vector<std::string> entries;
        for (int32_t block : manager.BlockTable(seq->seq_id, g)) {
          entries.push_back(block == BlockManager::kNoBlock ? "-" : StrCat(block));
        }
        groups.push_back(StrJoin(entries, " "));
      }
      parts.push_back(StrCat(SeqName(*seq), "[", StrJoin(groups, " | "), "]"));
    }
    return StrJoin(parts, " ");
  }
  // "B:max_tokens": samples finished by the last Step or Abort, with their reasons, in request id
  // order.
  std::string Finished() const { return StrJoin(finished_this_step_, " "); }

 private:
  std::string SeqName(RequestId request_id, int32_t sample_index) const {
    const std::string& name = names_.at(request_id);
    const bool multi = samples_.at(request_id).size() > 1;
    return multi ? StrCat(name, sample_index) : name;
  }
  std::string SeqName(const Sequence& seq) const {
    return SeqName(seq.request_id, seq.sample_index);
  }
  std::string Names(const std::vector<Sequence*>& seqs) const {
    std::vector<std::string> parts;
    parts.reserve(seqs.size());
    for (const Sequence* seq : seqs) parts.push_back(SeqName(*seq));
    return StrJoin(parts, " ");
  }

  void Drain() {
    for (auto& [id, stream] : streams_) {
      for (RequestOutput& output : stream->TakeAvailable()) {
        SampleResult& r = samples_.at(id).at(static_cast<size_t>(output.sample_index));
        EXPECT_EQ(r.num_finished_outputs, 0) << "output after the final one, request " << id;
        r.token_ids.insert(r.token_ids.end(), output.token_ids.begin(), output.token_ids.end());
        r.text += output.text;
        r.logprobs.insert(r.logprobs.end(), output.logprobs.begin(), output.logprobs.end());
        r.prompt_logprobs.insert(r.prompt_logprobs.end(), output.prompt_logprobs.begin(),
                                 output.prompt_logprobs.end());
        r.token_times_seconds.insert(r.token_times_seconds.end(),
                                     output.token_times_seconds.begin(),
                                     output.token_times_seconds.end());
        if (output.finished) {
          ++r.num_finished_outputs;
          const bool multi = samples_.at(id).size() > 1;
          finished_this_step_.push_back(StrCat(names_.at(id),
                                               multi ? StrCat(output.sample_index) : std::string(),
                                               ":", FinishReasonName(output.finish_reason)));
          r.final_output = std::move(output);
        }
      }
    }
  }

  int64_t vocab_size_;
  ManualClock clock_;
  FakeRunner* runner_ = nullptr;  // owned by core_
  std::unique_ptr<EngineCore> core_;
  RequestId next_id_ = 1;
  std::map<RequestId, std::string> names_;
  std::map<RequestId, std::shared_ptr<OutputStream>> streams_;
  std::map<RequestId, std::vector<SampleResult>> samples_;
  std::vector<std::string> finished_this_step_;
};

// One row of a scheduler table: the state after step `step`.
struct StepRow {
  int step;
  std::string scheduled;  // "A:8 B:1", batch order
  std::string running;    // admission order
  std::string waiting;    // (priority, arrival) order
  std::string blocks;     // block tables of the running sequences
  std::string preempted{};
  std::string finished{};
};

// Runs the rows' steps in order (each row's step must be the next one) and checks each.
inline void ExpectSteps(CoreHarness& harness, int* step, const std::vector<StepRow>& rows) {
  for (const StepRow& row : rows) {
    ASSERT_EQ(row.step, *step + 1) << "rows must follow each other";
    ASSERT_TRUE(harness.Step()) << "step " << row.step << " had nothing to do";
    ++*step;
    SCOPED_TRACE(StrCat("after step ", row.step));
    EXPECT_EQ(harness.Scheduled(), row.scheduled);
    EXPECT_EQ(harness.Running(), row.running);
    EXPECT_EQ(harness.Waiting(), row.waiting);
    EXPECT_EQ(harness.Blocks(), row.blocks);
    EXPECT_EQ(harness.Preempted(), row.preempted);
    EXPECT_EQ(harness.Finished(), row.finished);
  }
}

}  // namespace lmserve::engine::testing

#endif  // LMSERVE_TESTS_ENGINE_CORE_ENGINE_TEST_UTIL_H_
