// A fake model runner for engine tests: fast, exact, and strict about the runner contract.
//
// It keeps a real paged cache of token ids (one slot per block position) and computes logits from
// what it reads back through each sequence's block table, so a wrong block table, a prefix-cache
// hit on the wrong block or a lost block after preemption changes the tokens, and reading a slot
// never written is an error. The logits after a context are a pure function of the context's tokens
// (FakeLogits), so an oracle can compute what any request must produce without the engine.

#ifndef LMSERVE_TESTS_ENGINE_CORE_FAKE_RUNNER_H_
#define LMSERVE_TESTS_ENGINE_CORE_FAKE_RUNNER_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/hash.h"
#include "common/strings.h"
#include "engine/core/clock.h"
#include "engine/runner/model_runner.h"

namespace lmserve::engine::testing {

// The state after a context: fold each token in.
inline uint64_t FakeContextHash(uint64_t hash, int32_t token_id) {
  return HashCombine(hash, static_cast<uint64_t>(static_cast<uint32_t>(token_id)));
}
constexpr uint64_t kFakeEmptyContextHash = 0x1234567ULL;

// The logits after a context whose hash is `context_hash`: values in [0, 4), distinct.
inline void FakeLogitsFromHash(uint64_t context_hash, int64_t vocab_size, float* out) {
  for (int64_t v = 0; v < vocab_size; ++v) {
    const uint64_t bits =
        Mix64(context_hash ^ (static_cast<uint64_t>(v) * 0xd1b54a32d192ed03ULL));
    out[v] = static_cast<float>(bits >> 40) * (4.0f / 16777216.0f);
  }
}

// A model of one full-attention KV cache group sees the whole context; any other sees, in each
// group, the tokens in the group's window. `read(group, position)` gives the token there.
inline bool FakeIsFullAttentionOnly(std::span<const int32_t> group_windows) {
  return group_windows.empty() || (group_windows.size() == 1 && group_windows[0] == 0);
}

// The state after the context [0, last_position], with `read` giving its tokens.
template <typename Read>
uint64_t FakeRowHash(int32_t last_position, std::span<const int32_t> group_windows, Read read) {
  uint64_t hash = kFakeEmptyContextHash;
  if (FakeIsFullAttentionOnly(group_windows)) {
    for (int32_t position = 0; position <= last_position; ++position) {
      hash = FakeContextHash(hash, read(0, position));
    }
    return hash;
  }
  for (size_t g = 0; g < group_windows.size(); ++g) {
    const int32_t window = group_windows[g];
    const int32_t first = window == 0 ? 0 : std::max(0, last_position - window + 1);
    uint64_t group_hash = Mix64(static_cast<uint64_t>(first) * 31 + g);
    for (int32_t position = first; position <= last_position; ++position) {
      group_hash = FakeContextHash(group_hash, read(static_cast<int32_t>(g), position));
    }
    hash = HashCombine(hash, group_hash);
  }
  return hash;
}

inline std::vector<float> FakeLogits(std::span<const int32_t> context, int64_t vocab_size,
                                     std::span<const int32_t> group_windows = {}) {
  const uint64_t hash = FakeRowHash(
      static_cast<int32_t>(context.size()) - 1, group_windows,
      [&](int32_t, int32_t position) { return context[static_cast<size_t>(position)]; });
  std::vector<float> logits(static_cast<size_t>(vocab_size));
  FakeLogitsFromHash(hash, vocab_size, logits.data());
  return logits;
}

// What greedy decoding of the fake model gives: tokens after `prompt` until one of `stop_ids`
// (included) or `max_tokens`.
inline std::vector<int32_t> FakeGreedy(std::vector<int32_t> context, int32_t max_tokens,
                                       const std::vector<int32_t>& stop_ids, int64_t vocab_size,
                                       std::span<const int32_t> group_windows = {}) {
  std::vector<int32_t> output;
  while (static_cast<int32_t>(output.size()) < max_tokens) {
    const std::vector<float> logits = FakeLogits(context, vocab_size, group_windows);
    const int32_t token =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    output.push_back(token);
    context.push_back(token);
    if (std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end()) break;
  }
  return output;
}

struct FakeRunnerOptions {
  int64_t vocab_size = 64;
  int32_t block_size_tokens = 4;
  int32_t num_kv_blocks = 64;
  int64_t max_position_embeddings = 256;
  std::vector<int32_t> eos_token_ids = {0};
  // The KV cache groups' windows (0: full attention); the fake model's logits depend on what each
  // group's window shows (FakeRowHash), read back through that group's block tables.
  std::vector<int32_t> kv_group_windows = {0};
  ManualClock* clock = nullptr;  // advanced by each Execute when set
  double seconds_per_step = 0.0;
  double seconds_per_token = 0.0;
  std::function<void()> on_execute;  // called first in each Execute (engine thread), when set
  // LogitsMode::kSample: the runner draws (greedy: the row's largest logit) and returns the token.
  bool samples_on_device = false;
  // Async scheduling (ModelRunner::CanLaunchAhead): Launch runs the step at once and Finish only
  // hands it over, so that a step whose tokens are all drawn here may stay unfinished while the
  // next is launched; pending tokens are taken from its draws. Off: Execute runs in Finish.
  bool launch_ahead = false;
};

class FakeRunner final : public ModelRunner {
 public:
  explicit FakeRunner(const FakeRunnerOptions& options)
      : options_(options),
        slots_(static_cast<size_t>(options.num_kv_blocks) * options.block_size_tokens, -1),
        slot_groups_(slots_.size(), -1) {
    config_.vocab_size = options.vocab_size;
    config_.max_position_embeddings = options.max_position_embeddings;
    config_.eos_token_ids = options.eos_token_ids;
    config_.name = "fake";
  }

  const ModelConfig& model_config() const override { return config_; }
  Backend backend() const override { return Backend::kCpu; }
  int32_t block_size_tokens() const override { return options_.block_size_tokens; }
  int32_t num_kv_blocks() const override { return options_.num_kv_blocks; }
  std::vector<int32_t> kv_group_windows() const override { return options_.kv_group_windows; }
  bool samples_on_device() const override { return options_.samples_on_device; }

  absl::Status Launch(const StepBatch& batch, StepOutput* output) override {
    if (!options_.launch_ahead) return ModelRunner::Launch(batch, output);
    if (!launched_.empty() && !CanLaunchAhead()) {
      return absl::FailedPreconditionError("FakeRunner: Launch before the step's Finish");
    }
    StepBatch resolved = batch;
    for (const PendingToken& pending : batch.pending_tokens) {
      if (launched_.empty() || pending.launched_seq >= launched_.back().num_seqs ||
          pending.token < 0 || pending.token >= batch.num_tokens() ||
          batch.token_ids[static_cast<size_t>(pending.token)] != 0) {
        return absl::InvalidArgumentError("FakeRunner: a pending token without its draw");
      }
      const int32_t drawn =
          launched_.back().output->sampled_tokens[static_cast<size_t>(pending.launched_seq)];
      if (drawn < 0) return absl::InvalidArgumentError("FakeRunner: a pending token never drawn");
      resolved.token_ids[static_cast<size_t>(pending.token)] = drawn;
    }
    if (absl::Status status = Execute(resolved, output); !status.ok()) return status;
    const bool tokens_only =
        batch.token_bitmask.empty() &&
        std::none_of(batch.logits_modes.begin(), batch.logits_modes.end(), [](LogitsMode mode) {
          return mode == LogitsMode::kLast || mode == LogitsMode::kAll;
        });
    launched_.push_back({output, batch.num_seqs(), tokens_only});
    num_pending_tokens_ += static_cast<int64_t>(batch.pending_tokens.size());
    return absl::OkStatus();
  }
  absl::Status Finish() override {
    if (!options_.launch_ahead) return ModelRunner::Finish();
    if (launched_.empty()) {
      return absl::FailedPreconditionError("FakeRunner: Finish without Launch");
    }
    launched_.erase(launched_.begin());
    return absl::OkStatus();
  }
  bool CanLaunchAhead() const override {
    return options_.launch_ahead && launched_.size() == 1 && launched_.back().tokens_only;
  }

  absl::Status Execute(const StepBatch& batch, StepOutput* output) override {
    if (options_.on_execute) options_.on_execute();
    if (options_.clock != nullptr) {
      options_.clock->AdvanceSeconds(options_.seconds_per_step +
                                     options_.seconds_per_token * batch.num_tokens());
    }
    ++num_steps_;
    if (!fail_next_.ok()) {
      absl::Status status = fail_next_;
      fail_next_ = absl::OkStatus();
      return status;
    }
    if (absl::Status status = Validate(batch); !status.ok()) return status;
    const int32_t block_size = options_.block_size_tokens;
    const std::vector<int32_t>& windows = options_.kv_group_windows;
    const int32_t num_groups = static_cast<int32_t>(windows.size());
    output->logits.clear();
    output->logits_row_start.assign(1, 0);
    output->sampled_tokens.assign(static_cast<size_t>(batch.num_seqs()), -1);
    for (int32_t i = 0; i < batch.num_seqs(); ++i) {
      const int32_t num_new = batch.query_start[i + 1] - batch.query_start[i];
      const int32_t context_len = batch.context_lens[i];
      const int32_t first_new = context_len - num_new;
      auto slot = [&](int32_t group, int32_t position) -> size_t {
        const int32_t block =
            batch.BlockTable(i, group)[static_cast<size_t>(position / block_size)];
        return static_cast<size_t>(block) * block_size + position % block_size;
      };
      for (int32_t g = 0; g < num_groups; ++g) {
        for (int32_t j = 0; j < num_new; ++j) {
          slots_[slot(g, first_new + j)] = batch.token_ids[batch.query_start[i] + j];
          slot_groups_[slot(g, first_new + j)] = g;
        }
        // Every position a query of this step reads must hold what this group wrote there.
        const int32_t window = windows[static_cast<size_t>(g)];
        const int32_t first_read = window == 0 ? 0 : std::max(0, first_new - window + 1);
        for (int32_t position = first_read; position < context_len; ++position) {
          const int32_t block = batch.BlockTable(i, g)[static_cast<size_t>(position / block_size)];
          if (block < 0 || slots_[slot(g, position)] < 0 || slot_groups_[slot(g, position)] != g) {
            return absl::InternalError(StrCat("FakeRunner: seq ", i, " group ", g,
                                              " reads unwritten position ", position, " (block ",
                                              block, ")"));
          }
        }
      }
      auto read = [&](int32_t group, int32_t position) { return slots_[slot(group, position)]; };
      auto add_row = [&](uint64_t hash) {
        const size_t offset = output->logits.size();
        output->logits.resize(offset + static_cast<size_t>(options_.vocab_size));
        FakeLogitsFromHash(hash, options_.vocab_size, output->logits.data() + offset);
      };
      const LogitsMode mode = batch.logits_modes[i];
      if (mode == LogitsMode::kSample) {
        if (!options_.samples_on_device) {
          return absl::InvalidArgumentError("FakeRunner: kSample without samples_on_device");
        }
        std::vector<float> row(static_cast<size_t>(options_.vocab_size));
        FakeLogitsFromHash(FakeRowHash(context_len - 1, windows, read), options_.vocab_size,
                           row.data());
        output->sampled_tokens[static_cast<size_t>(i)] =
            static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
      } else if (FakeIsFullAttentionOnly(windows)) {
        uint64_t hash = kFakeEmptyContextHash;  // one pass over the context
        for (int32_t position = 0; position < context_len; ++position) {
          hash = FakeContextHash(hash, read(0, position));
          if ((mode == LogitsMode::kAll && position >= first_new) ||
              (mode == LogitsMode::kLast && position == context_len - 1)) {
            add_row(hash);
          }
        }
      } else if (mode == LogitsMode::kAll || mode == LogitsMode::kLast) {
        for (int32_t position = mode == LogitsMode::kAll ? first_new : context_len - 1;
             position < context_len; ++position) {
          add_row(FakeRowHash(position, windows, read));
        }
      }
      output->logits_row_start.push_back(
          static_cast<int32_t>(output->logits.size() / static_cast<size_t>(options_.vocab_size)));
    }
    max_batch_tokens_ = std::max(max_batch_tokens_, batch.num_tokens());
    return absl::OkStatus();
  }

  // The next Execute returns `status` without computing anything.
  void FailNextStep(absl::Status status) { fail_next_ = std::move(status); }
  int64_t num_steps() const { return num_steps_; }
  int32_t max_batch_tokens() const { return max_batch_tokens_; }
  int64_t num_pending_tokens() const { return num_pending_tokens_; }

 private:
  absl::Status Validate(const StepBatch& batch) const {
    return ValidateStepBatch(batch, config_, options_.block_size_tokens, options_.num_kv_blocks,
                             options_.kv_group_windows);
  }

  FakeRunnerOptions options_;
  ModelConfig config_;
  std::vector<int32_t> slots_;  // [num_kv_blocks * block_size]: the token id written, -1: never
  std::vector<int32_t> slot_groups_;  // the KV cache group that wrote each slot
  absl::Status fail_next_;
  struct Launched {
    StepOutput* output = nullptr;
    int32_t num_seqs = 0;
    bool tokens_only = false;  // no logits rows, no masks: may stay unfinished (launch_ahead)
  };
  std::vector<Launched> launched_;  // launch_ahead: launched, not finished, oldest first
  int64_t num_pending_tokens_ = 0;
  int64_t num_steps_ = 0;
  int32_t max_batch_tokens_ = 0;
};

// A text decoder for the fake vocabulary: token t decodes to kFakeTokenText[t % size].
inline std::string FakeTokenText(int32_t token_id) {
  static const char* const kPieces[] = {"<eos>", "a", "b", "c",  " ",    "ab", "ba", "cc",
                                        "x",     "y", "z", "\n", "STOP", "S",  "TO", "P"};
  return kPieces[token_id % 16];
}

}  // namespace lmserve::engine::testing

#endif  // LMSERVE_TESTS_ENGINE_CORE_FAKE_RUNNER_H_
