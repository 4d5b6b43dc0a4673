#include "engine/core/engine_core.h"

#include <algorithm>
#include <optional>
#include <span>
#include <utility>

#include "common/hash.h"
#include "common/strings.h"
#include "engine/core/check.h"
#include "engine/structured/matcher.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/philox.h"

namespace lmserve::engine {

struct EngineCore::SampleState {
  Sequence seq;
  RequestState* request = nullptr;
  std::unique_ptr<IncrementalTextDecoder> decoder;  // null without a text decoder
  StopStringMatcher matcher{{}};
  std::unique_ptr<structured::GrammarMatcher> grammar;  // sampling.constraint's state, or null
  bool finished = false;
  double first_scheduled_seconds = -1.0;
  double first_token_seconds = -1.0;
  // Async scheduling: its index in the step launched ahead, whose draw is its pending token.
  int32_t ahead_batch_index = -1;
};

struct EngineCore::RequestState {
  RequestId id = 0;
  Request request;
  double arrival_seconds = 0.0;
  std::shared_ptr<OutputStream> stream;
  uint64_t seed = 0;
  int32_t max_total_tokens = 0;  // prompt + generated tokens at most
  std::vector<std::unique_ptr<SampleState>> samples;
  int32_t num_unfinished_samples = 0;
  // Prompt logprobs, computed by sample 0 and sent with its first token.
  std::vector<PositionLogprobs> prompt_logprobs;
  int32_t next_prompt_logprob_position = 1;
  bool prompt_logprobs_sent = false;

  const SamplingParams& params() const { return request.sampling; }
  int32_t num_prompt_tokens() const {
    return static_cast<int32_t>(request.prompt_token_ids.size());
  }
  bool owes_prompt_logprobs() const {
    return params().prompt_logprobs.has_value() &&
           next_prompt_logprob_position < num_prompt_tokens();
  }
};

absl::StatusOr<std::unique_ptr<EngineCore>> EngineCore::Create(
    std::unique_ptr<ModelRunner> runner, const EngineConfig& config,
    std::unique_ptr<TextDecoder> text_decoder) {
  if (runner == nullptr) return absl::InvalidArgumentError("EngineCore: no runner");
  if (runner->block_size_tokens() <= 0 || runner->num_kv_blocks() <= 0) {
    return absl::InvalidArgumentError(StrCat("EngineCore: the runner has ", runner->num_kv_blocks(),
                                             " KV blocks of ", runner->block_size_tokens(),
                                             " tokens; the KV cache budget is too small"));
  }
  const ModelConfig& model = runner->model_config();
  if (model.vocab_size <= 0) return absl::InvalidArgumentError("EngineCore: empty vocabulary");
  if (config.max_num_seqs < 1) {
    return absl::InvalidArgumentError(
        StrCat("EngineConfig.max_num_seqs: must be >= 1, got ", config.max_num_seqs));
  }
  if (config.max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError(StrCat(
        "EngineConfig.max_num_batched_tokens: must be >= 1, got ", config.max_num_batched_tokens));
  }
  if (config.long_prefill_token_threshold < 0 || config.max_model_len < 0 ||
      config.max_logprobs < 0 || config.max_n < 1) {
    return absl::InvalidArgumentError(
        "EngineConfig: long_prefill_token_threshold, max_model_len and max_logprobs must be >= 0, "
        "max_n >= 1");
  }
  if (!(config.max_step_slowdown == 0.0 ||
        (config.max_step_slowdown >= 1.0 && config.max_step_slowdown <= 1e6))) {
    return absl::InvalidArgumentError(
        StrCat("EngineConfig.max_step_slowdown: must be 0 (off) or in [1, 1e6], got ",
               config.max_step_slowdown));
  }
  if (config.structured_mask_threads < 0 || config.structured_mask_threads > 256) {
    return absl::InvalidArgumentError(
        StrCat("EngineConfig.structured_mask_threads: must be in [0, 256], got ",
               config.structured_mask_threads));
  }
  if (config.max_prompt_logits_bytes_per_step < 1) {
    return absl::InvalidArgumentError(
        "EngineConfig.max_prompt_logits_bytes_per_step: must be >= 1");
  }
  int64_t context_tokens = model.max_position_embeddings;
  if (config.max_model_len > 0) {
    context_tokens = context_tokens > 0 ? std::min<int64_t>(context_tokens, config.max_model_len)
                                        : config.max_model_len;
  }
  if (context_tokens < 2) {
    return absl::InvalidArgumentError(
        StrCat("EngineCore: context length ", context_tokens,
               " (model max_position_embeddings, EngineConfig.max_model_len) is too small"));
  }
  for (int32_t token_id : model.eos_token_ids) {
    if (token_id < 0 || token_id >= model.vocab_size) {
      return absl::InvalidArgumentError(
          StrCat("EngineCore: the model's EOS token id ", token_id, " is outside the vocabulary"));
    }
  }
  RequestLimits limits;
  limits.vocab_size = model.vocab_size;
  limits.max_context_tokens = static_cast<int32_t>(std::min<int64_t>(context_tokens, INT32_MAX));
  // Windowed KV cache groups hold a bounded number of blocks whatever the context.
  const int32_t max_step_tokens =
      config.long_prefill_token_threshold > 0
          ? std::min(config.long_prefill_token_threshold, config.max_num_batched_tokens)
          : config.max_num_batched_tokens;
  const std::vector<int32_t> group_windows = runner->kv_group_windows();
  if (group_windows.empty() ||
      std::any_of(group_windows.begin(), group_windows.end(), [](int32_t w) { return w < 0; })) {
    return absl::InvalidArgumentError("EngineCore: the runner has no valid KV cache groups");
  }
  limits.kv_cache_tokens = MaxTokensPerSequence(
      runner->num_kv_blocks(), runner->block_size_tokens(), group_windows, max_step_tokens);
  limits.max_logprobs = config.max_logprobs;
  limits.max_n = config.max_n;
  limits.has_text_decoder = text_decoder != nullptr;
  return std::unique_ptr<EngineCore>(
      new EngineCore(std::move(runner), config, std::move(text_decoder), limits));
}

EngineCore::EngineCore(std::unique_ptr<ModelRunner> runner, const EngineConfig& config,
                       std::unique_ptr<TextDecoder> text_decoder, const RequestLimits& limits)
    : config_(config),
      clock_(config.clock != nullptr ? config.clock : SystemClock::Get()),
      limits_(limits),
      runner_(std::move(runner)),
      text_decoder_(std::move(text_decoder)),
      eos_token_ids_(runner_->model_config().eos_token_ids),
      vocab_size_(runner_->model_config().vocab_size),
      // Prefix caching is off for models with recurrent state: a cached block holds no state.
      block_manager_(runner_->num_kv_blocks(), runner_->block_size_tokens(),
                     config.enable_prefix_caching && runner_->num_state_slots() == 0,
                     runner_->kv_group_windows()),
      state_slots_(runner_->num_state_slots()),
      scheduler_(
          SchedulerConfig{.max_num_seqs = config.max_num_seqs,
                          .max_num_batched_tokens = config.max_num_batched_tokens,
                          .long_prefill_token_threshold = config.long_prefill_token_threshold},
          &block_manager_, &state_slots_),
      sampler_(runner_->model_config().vocab_size),
      seed_state_(config.seed),
      max_prompt_logits_rows_(static_cast<int32_t>(
          std::clamp<int64_t>(config.max_prompt_logits_bytes_per_step /
                                  (std::max<int64_t>(vocab_size_, 1) * int64_t{sizeof(float)}),
                              1, INT32_MAX))),
      mask_threads_(config.structured_mask_threads > 0
                        ? config.structured_mask_threads
                        : std::min(4, kernels::PhysicalCoreCount())),
      emitter_(config.emit_outputs_on_thread ? std::make_unique<OutputEmitter>() : nullptr) {}

EngineCore::~EngineCore() {
  // The runner must not be left with a step launched ahead and unfinished.
  if (ahead_.has_value()) runner_->Finish().IgnoreError();
}

void EngineCore::AddRequest(RequestId id, Request request, double arrival_seconds,
                            std::shared_ptr<OutputStream> stream) {
  LMSERVE_CORE_CHECK(!requests_.contains(id), "request id ", id, " added twice");
  auto state = std::make_unique<RequestState>();
  RequestState& r = *state;
  r.id = id;
  r.request = std::move(request);
  r.arrival_seconds = arrival_seconds;
  r.stream = std::move(stream);
  const SamplingParams& params = r.params();
  r.seed = params.seed.has_value() ? *params.seed : SplitMix64(&seed_state_);
  const int64_t limit = std::min<int64_t>(limits_.max_context_tokens, limits_.kv_cache_tokens);
  r.max_total_tokens = static_cast<int32_t>(
      params.max_tokens.has_value()
          ? std::min<int64_t>(limit, int64_t{r.num_prompt_tokens()} + *params.max_tokens)
          : limit);
  const int64_t arrival_order = next_arrival_order_++;
  for (int32_t index = 0; index < params.n; ++index) {
    auto sample = std::make_unique<SampleState>();
    sample->request = &r;
    Sequence& seq = sample->seq;
    seq.seq_id = next_seq_id_++;
    seq.request_id = id;
    seq.sample_index = index;
    seq.priority = r.request.priority;
    seq.arrival_order = arrival_order;
    seq.num_prompt_tokens = r.num_prompt_tokens();
    seq.tokens = r.request.prompt_token_ids;
    seq.prompt_source = index == 0 ? nullptr : &r.samples[0]->seq;
    seq.use_prefix_cache = !(index == 0 && r.owes_prompt_logprobs());
    // Prompt logprobs: each step's chunk brings its logits rows, at most max_prompt_logits_rows_.
    if (!seq.use_prefix_cache) seq.max_tokens_per_step = max_prompt_logits_rows_;
    if (text_decoder_ != nullptr) {
      sample->decoder = text_decoder_->NewSequence(r.request.prompt_token_ids);
    }
    sample->matcher = StopStringMatcher(params.stop);
    if (params.constraint != nullptr) {
      sample->grammar = std::make_unique<structured::GrammarMatcher>(params.constraint);
    }
    samples_by_seq_id_[seq.seq_id] = sample.get();
    r.samples.push_back(std::move(sample));
  }
  r.num_unfinished_samples = params.n;
  for (auto& sample : r.samples) scheduler_.AddWaiting(&sample->seq);
  requests_.emplace(id, std::move(state));
}

void EngineCore::Abort(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  const double now = clock_->NowSeconds();
  for (auto& sample : it->second->samples) {
    if (!sample->finished) FinishSample(sample.get(), FinishReason::kAborted, now, {});
  }
  ReapFinishedRequests();
  if (emitter_ != nullptr) emitter_->Flush();
}

void EngineCore::StopEmitter() { emitter_.reset(); }

void EngineCore::ReapFinishedRequests() {
  std::vector<RequestId> done;
  for (SampleState* sample : finished_this_step_) {
    if (sample->request->num_unfinished_samples == 0) done.push_back(sample->request->id);
  }
  finished_this_step_.clear();
  for (RequestId id : done) requests_.erase(id);  // a request may be listed more than once
}

void EngineCore::AbortAll() {
  std::vector<RequestId> ids;
  ids.reserve(requests_.size());
  for (const auto& [id, state] : requests_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  for (RequestId id : ids) Abort(id);
  if (ahead_.has_value()) FinishAhead();  // its sequences are gone: it only ends
}

namespace {

// Finishes a launched step if the scope is left before `runner` is cleared (an exception).
struct FinishOnUnwind {
  explicit FinishOnUnwind(ModelRunner* launched) : runner(launched) {}
  FinishOnUnwind(const FinishOnUnwind&) = delete;
  FinishOnUnwind& operator=(const FinishOnUnwind&) = delete;
  ~FinishOnUnwind() {
    if (runner != nullptr) runner->Finish().IgnoreError();
  }
  ModelRunner* runner;
};

}  // namespace

bool EngineCore::Step() {
  if (!scheduler_.HasWork()) {
    if (!ahead_.has_value()) return false;
    FinishAhead();  // the last tokens of a step launched ahead
    return true;
  }
  const double start = clock_->NowSeconds();
  const int32_t prefill_budget = PrefillBudget();
  last_schedule_ = scheduler_.Schedule(prefill_budget);
  // Sequences of one new token first (decodes, in the scheduler's order), then the chunks: a
  // GPU runner gives that leading run to its decode attention kernel in one launch.
  std::stable_partition(last_schedule_.scheduled.begin(), last_schedule_.scheduled.end(),
                        [](const ScheduledSequence& s) { return s.num_new_tokens == 1; });
  stats_.last_prefill_budget = prefill_budget == Scheduler::kNoPrefillBudget ? 0 : prefill_budget;
  const SchedulerOutput& plan = last_schedule_;
  if (plan.scheduled.empty() && ahead_.has_value()) {
    // Every running sequence awaits its last token from the step launched ahead.
    FinishAhead();
    return true;
  }
  LMSERVE_CORE_CHECK(!plan.scheduled.empty(), "an empty plan with ", scheduler_.num_running(),
                     " running and ", scheduler_.num_waiting(), " waiting sequences");
  last_scheduled_.clear();
  last_preempted_.clear();
  step_seq_ids_.clear();
  for (const ScheduledSequence& scheduled : plan.scheduled) {
    SampleState* sample = samples_by_seq_id_.at(scheduled.seq->seq_id);
    if (sample->first_scheduled_seconds < 0.0) sample->first_scheduled_seconds = start;
    last_scheduled_.push_back(
        {scheduled.seq->request_id, scheduled.seq->sample_index, scheduled.num_new_tokens});
    step_seq_ids_.push_back(scheduled.seq->seq_id);
  }
  for (const Sequence* seq : plan.preempted) {
    last_preempted_.push_back({seq->request_id, seq->sample_index, 0});
  }

  BuildBatch(plan);
  // The step's masks are computed while the forward pass runs (Launch returns while a GPU runs
  // it); the masked draw waits for them (Finish). Serially, they come before the launch.
  if (!config_.overlap_structured_masks) ComputeMasks();
  const double launch_start = clock_->NowSeconds();
  stats_.total_prepare_seconds += launch_start - start;
  absl::Status status = runner_->Launch(*batch_, step_output_);
  stats_.total_launch_seconds += clock_->NowSeconds() - launch_start;
  int32_t prefill_tokens = 0;
  // Whether the step stays unfinished while the next is scheduled: the runner says so only of a
  // step whose outputs are tokens drawn on the device (no logits rows, no masks).
  const bool goes_ahead = config_.async_scheduling && status.ok() && runner_->CanLaunchAhead();
  // Computed as far as the host is concerned once launched, where a step goes ahead or one is
  // ahead of it: reading that one's tokens may finish sequences of this plan.
  const bool computed_at_launch =
      goes_ahead || (config_.async_scheduling && status.ok() && ahead_.has_value());
  if (computed_at_launch) {
    scheduler_.OnStepComputed(plan);
    prefill_tokens = PrefillTokens(plan);
    if (goes_ahead) {
      MarkPendingTokens();
      if (ahead_.has_value()) FinishAhead();  // the step before it, now that this one is queued
      ahead_ = AheadStep{.batch = batch_,
                         .output = step_output_,
                         .seq_ids = step_seq_ids_,
                         .started_seconds = start,
                         .prefill_tokens = prefill_tokens,
                         .prefill_budget = prefill_budget,
                         .num_tokens = plan.num_batched_tokens};
      ++num_steps_launched_ahead_;
      const int next = batch_ == &batches_[0] ? 1 : 0;
      batch_ = &batches_[next];
      step_output_ = &step_outputs_[next];
      return true;
    }
  }
  // The step launched ahead of this one finishes first (the runner's order).
  if (ahead_.has_value()) FinishAhead();
  if (status.ok()) {
    // A launched step is always finished: a masked draw waits on the device for the masks that
    // Finish releases, so an exception out of the masks finishes the step on its way out.
    FinishOnUnwind finish_on_unwind(runner_.get());
    if (config_.overlap_structured_masks) ComputeMasks();
    const double finish_start = clock_->NowSeconds();
    finish_on_unwind.runner = nullptr;
    status = runner_->Finish();
    stats_.total_finish_seconds += clock_->NowSeconds() - finish_start;
  }
  if (status.ok()) status = CheckStepOutput(*batch_, *step_output_);
  const double now = clock_->NowSeconds();
  if (status.ok() && !computed_at_launch) {
    scheduler_.OnStepComputed(plan);
    prefill_tokens = PrefillTokens(plan);
  }
  ProcessStep(status, step_seq_ids_, *batch_, *step_output_, /*launched_ahead=*/false, now);
  EndStep(status.ok(), start, now, prefill_tokens, prefill_budget, plan.num_batched_tokens);
  return true;
}

void EngineCore::EndStep(bool ok, double started, double now, int32_t prefill_tokens,
                         int32_t prefill_budget, int32_t num_tokens) {
  // From its scheduling, or from the end of the step before where that came later (a step
  // scheduled while the one before ran).
  const double seconds = now - std::max(started, last_step_end_seconds_);
  last_step_end_seconds_ = now;
  if (ok) MeasureStep(prefill_tokens, prefill_budget, seconds);
  ReapFinishedRequests();
  if (emitter_ != nullptr) emitter_->Flush();
  stats_.total_process_seconds += clock_->NowSeconds() - now;

  ++stats_.num_steps;
  stats_.last_step_seconds = seconds;
  stats_.total_step_seconds += seconds;
  stats_.last_step_tokens = num_tokens;
  stats_.total_step_tokens += num_tokens;
}

void EngineCore::MarkPendingTokens() {
  const std::vector<LogitsMode>& modes = batch_->logits_modes;
  for (size_t i = 0; i < modes.size(); ++i) {
    if (modes[i] != LogitsMode::kSample) continue;
    SampleState* sample = samples_by_seq_id_.at(step_seq_ids_[i]);
    Sequence& seq = sample->seq;
    sample->ahead_batch_index = static_cast<int32_t>(i);
    // The token that reaches the length limit finishes the sequence whatever it is.
    if (seq.num_known_tokens() + 1 >= sample->request->max_total_tokens) {
      seq.awaiting_last_token = true;
    } else {
      ++seq.num_pending_tokens;
    }
  }
}

void EngineCore::FinishAhead() {
  AheadStep ahead = *std::move(ahead_);
  ahead_.reset();
  const double finish_start = clock_->NowSeconds();
  absl::Status status = runner_->Finish();
  stats_.total_finish_seconds += clock_->NowSeconds() - finish_start;
  if (status.ok()) status = CheckStepOutput(*ahead.batch, *ahead.output);
  const double now = clock_->NowSeconds();
  ProcessStep(status, ahead.seq_ids, *ahead.batch, *ahead.output, /*launched_ahead=*/true, now);
  EndStep(status.ok(), ahead.started_seconds, now, ahead.prefill_tokens, ahead.prefill_budget,
          ahead.num_tokens);
}

void EngineCore::ProcessStep(absl::Status status, const std::vector<int64_t>& seq_ids,
                             const StepBatch& batch, const StepOutput& output, bool launched_ahead,
                             double now) {
  for (size_t i = 0; i < seq_ids.size(); ++i) {
    auto it = samples_by_seq_id_.find(seq_ids[i]);
    if (it == samples_by_seq_id_.end()) continue;  // finished since (a stop, an abort)
    SampleState* sample = it->second;
    if (launched_ahead && batch.logits_modes[i] == LogitsMode::kSample) {
      // Its oldest unread draw: a pending token, or else the last one it awaits (which no later
      // step follows).
      Sequence& seq = sample->seq;
      if (seq.num_pending_tokens > 0) {
        --seq.num_pending_tokens;
      } else {
        LMSERVE_CORE_CHECK(seq.awaiting_last_token, "seq ", seq.seq_id,
                           " read a token it did not wait for");
        seq.awaiting_last_token = false;
      }
    }
    if (!status.ok()) {
      RequestOutput error;
      error.error = status.ToString();
      FinishSample(sample, FinishReason::kError, now, std::move(error));
      continue;
    }
    ProcessSequence(sample, static_cast<int32_t>(i), batch, output, now);
  }
}

int32_t EngineCore::PrefillBudget() const {
  if (config_.max_step_slowdown <= 0.0) return Scheduler::kNoPrefillBudget;
  // Only while some sequence decodes: a step then delays its next token.
  const std::vector<Sequence*>& running = scheduler_.running();
  const bool decoding = std::any_of(running.begin(), running.end(), [](const Sequence* seq) {
    return seq->num_output_tokens() > 0 && seq->num_known_tokens() - seq->num_computed_tokens == 1;
  });
  if (!decoding) return Scheduler::kNoPrefillBudget;
  // Until a chunk is measured, the least one: its step measures it.
  if (prefill_chunk_tokens_ <= 0.0) return kMinPrefillChunkTokens;
  return static_cast<int32_t>(std::clamp<double>(prefill_chunk_tokens_, kMinPrefillChunkTokens,
                                                 config_.max_num_batched_tokens));
}

int32_t EngineCore::PrefillTokens(const SchedulerOutput& plan) {
  int32_t prefill_tokens = 0;
  for (const ScheduledSequence& scheduled : plan.scheduled) {
    // Prompt chunks and recomputes (OnStepComputed has advanced num_computed_tokens past them).
    const Sequence& seq = *scheduled.seq;
    if (scheduled.num_new_tokens > 1 || seq.num_computed_tokens <= seq.num_prompt_tokens) {
      prefill_tokens += scheduled.num_new_tokens;
    }
  }
  return prefill_tokens;
}

void EngineCore::MeasureStep(int32_t prefill_tokens, int32_t prefill_budget, double seconds) {
  if (config_.max_step_slowdown <= 0.0 || seconds <= 0.0) return;
  if (prefill_tokens == 0) {
    // A decode-only step: an average that follows the batch as it changes.
    decode_step_seconds_ =
        decode_step_seconds_ <= 0.0 ? seconds : 0.75 * decode_step_seconds_ + 0.25 * seconds;
  } else if (decode_step_seconds_ > 0.0) {
    // Feedback: the chunk that would have made this step take the target, c * target / t. The
    // step time is no straight line in the chunk (a CPU GEMM of two rows costs far more than one
    // row's), so the chunk is steered by what steps take rather than by a per-token cost. A chunk
    // smaller than the budget (the prompt's end, or a step with no budget) only lowers it. The
    // ratio is bounded per step, so that one step slowed by the machine moves it by 2x at most.
    const double target = config_.max_step_slowdown * decode_step_seconds_;
    const double ratio = std::clamp(target / seconds, 0.5, 2.0);
    if (prefill_tokens >= prefill_budget && prefill_chunk_tokens_ > 0.0) {
      prefill_chunk_tokens_ *= ratio;
    } else if (prefill_chunk_tokens_ <= 0.0 || ratio < 1.0) {
      const double chunk = prefill_tokens * ratio;
      prefill_chunk_tokens_ =
          prefill_chunk_tokens_ <= 0.0 ? chunk : std::min(prefill_chunk_tokens_, chunk);
    }
    prefill_chunk_tokens_ = std::clamp<double>(prefill_chunk_tokens_, kMinPrefillChunkTokens,
                                               config_.max_num_batched_tokens);
  }
  stats_.decode_step_seconds = decode_step_seconds_;
  stats_.prefill_chunk_tokens = prefill_chunk_tokens_;
}

void EngineCore::BuildBatch(const SchedulerOutput& plan) {
  // The runner bitmask's storage (and rows) outlives the batch: a cleared vector resized would
  // zero every row before each launch, where only the masked rows are written and read.
  if (batch_->token_bitmask.size() > spare_token_bitmask_.size()) {
    spare_token_bitmask_.swap(batch_->token_bitmask);
  }
  batch_->Clear();
  mask_jobs_.clear();
  const auto words = static_cast<size_t>((vocab_size_ + 31) / 32);
  for (const ScheduledSequence& scheduled : plan.scheduled) {
    const Sequence& seq = *scheduled.seq;
    SampleState* sample = samples_by_seq_id_.at(seq.seq_id);
    const RequestState& r = *sample->request;
    const int32_t begin = seq.num_computed_tokens;
    const int32_t end = begin + scheduled.num_new_tokens;
    // Row p predicts token p + 1: prompt logprobs need rows next_position - 1 .. P - 2.
    const bool wants_prompt_rows = seq.sample_index == 0 && r.owes_prompt_logprobs() &&
                                   end > r.next_prompt_logprob_position - 1 &&
                                   begin <= r.num_prompt_tokens() - 2;
    LogitsMode mode = wants_prompt_rows               ? LogitsMode::kAll
                      : end == seq.num_known_tokens() ? LogitsMode::kLast
                                                      : LogitsMode::kNone;
    if (mode == LogitsMode::kLast && runner_->samples_on_device() &&
        RunnerCanSample(r.params(), seq, runner_->samples_with_token_bitmask())) {
      mode = LogitsMode::kSample;
    }
    group_tables_.clear();
    for (int32_t g = 0; g < block_manager_.num_groups(); ++g) {
      group_tables_.push_back(block_manager_.BlockTable(seq.seq_id, g));
    }
    std::span<const int32_t> new_tokens;
    if (end <= seq.num_read_tokens()) {
      new_tokens = std::span<const int32_t>(seq.tokens).subspan(begin, scheduled.num_new_tokens);
    } else {
      // Async scheduling: its last token is the draw of the step launched ahead, not read yet;
      // the runner takes it on the device.
      LMSERVE_CORE_CHECK(ahead_.has_value() && end == seq.num_read_tokens() + 1 &&
                             seq.num_pending_tokens == 1 && sample->ahead_batch_index >= 0,
                         "seq ", seq.seq_id, " schedules tokens up to ", end, " with ",
                         seq.num_read_tokens(), " read and ", seq.num_pending_tokens, " pending");
      pending_step_tokens_.assign(seq.tokens.begin() + begin, seq.tokens.end());
      pending_step_tokens_.push_back(0);
      new_tokens = pending_step_tokens_;
      batch_->pending_tokens.push_back({.token = batch_->num_tokens() + end - 1 - begin,
                                        .launched_seq = sample->ahead_batch_index});
    }
    batch_->AddSequence(new_tokens, begin, group_tables_, mode, state_slots_.SlotOf(seq.seq_id));
    if (runner_->samples_on_device()) {
      const SamplingParams& p = r.params();
      // The Philox key and counter of the engine's own draw (ProcessSequence): one definition.
      batch_->sampling.push_back(
          {.temperature = static_cast<float>(p.temperature),
           .top_k = p.top_k,
           .top_p = static_cast<float>(p.top_p),
           .min_p = static_cast<float>(p.min_p),
           .seed = kernels::SampleStreamKey(r.seed, static_cast<uint64_t>(seq.sample_index)),
           .step = static_cast<uint64_t>(seq.num_known_tokens())});
      // The runner masks the row before its draw (ComputeMasks fills its row of the bitmask).
      if (mode == LogitsMode::kSample && sample->grammar != nullptr) {
        batch_->sampling.back().masked = true;
      }
    }
    if (sample->grammar != nullptr && end == seq.num_known_tokens()) {
      // The sequence draws a token this step: its mask is one of the step's (ComputeMasks).
      mask_jobs_.push_back({.sample = sample,
                            .batch_index = batch_->num_seqs() - 1,
                            .on_runner = mode == LogitsMode::kSample});
    }
  }
  // A row per sequence, in the runner's bitmask and the engine's (only the rows of mask_jobs_
  // are written and read).
  const size_t mask_words = static_cast<size_t>(batch_->num_seqs()) * words;
  bool on_runner = false, on_host = false;
  for (const MaskJob& job : mask_jobs_) (job.on_runner ? on_runner : on_host) = true;
  if (on_runner) {
    batch_->token_bitmask.swap(spare_token_bitmask_);
    batch_->token_bitmask.resize(mask_words);  // zeroes only what it grows by
  }
  if (on_host && host_token_bitmask_.size() < mask_words) host_token_bitmask_.resize(mask_words);
}

void EngineCore::ComputeMasks() {
  if (mask_jobs_.empty()) return;
  const double start = clock_->NowSeconds();
  FillMasks();
  stats_.total_mask_seconds += clock_->NowSeconds() - start;
  stats_.num_masks += static_cast<int64_t>(mask_jobs_.size());
}

void EngineCore::FillMasks() {
  const auto words = static_cast<size_t>((vocab_size_ + 31) / 32);
  auto fill = [&](const MaskJob& job) {
    std::vector<uint32_t>& masks = job.on_runner ? batch_->token_bitmask : host_token_bitmask_;
    const std::span<uint32_t> row =
        std::span<uint32_t>(masks).subspan(static_cast<size_t>(job.batch_index) * words, words);
    structured::GrammarMatcher& matcher = *job.sample->grammar;
    // A constraint of another vocabulary allows nothing here; ProcessSequence ends it. A matcher
    // past its bounds fills an empty mask and says Failed(), which ProcessSequence reports.
    if (static_cast<size_t>(matcher.grammar().trie().mask_words()) != words) {
      std::fill(row.begin(), row.end(), 0u);
      return;
    }
    matcher.FillMask(row);
  };
  // Masks differ in cost by 1000x (a cached state's copy, a trie walk): each thread takes the
  // next job as it gets free (chunks of one). Each matcher is one sequence's, on one thread;
  // compiled grammars shared by several sequences guard their own tables (matcher.h).
  kernels::ParallelForChunks(static_cast<int64_t>(mask_jobs_.size()), mask_threads_, 1,
                             [&](int64_t begin, int64_t end) {
                               for (int64_t j = begin; j < end; ++j) {
                                 fill(mask_jobs_[static_cast<size_t>(j)]);
                               }
                             });
}

bool RunnerCanSample(const SamplingParams& params, const Sequence& seq, bool runner_masks) {
  // The runner's sampler knows temperature, top-k, top-p and min-p only; logprobs need the row.
  // A structured-output constraint masks the row: on the host (Sampler::Sample) unless the
  // runner applies the engine's bitmasks.
  if ((params.constraint != nullptr && !runner_masks) || !params.logit_bias.empty() || params.repetition_penalty != 1.0 ||
      params.presence_penalty != 0.0 || params.frequency_penalty != 0.0 ||
      params.logprobs.has_value()) {
    return false;
  }
  // Before min_tokens, EOS and stop tokens are masked: the engine's sampler does that.
  return seq.num_output_tokens() >= params.min_tokens;
}

absl::Status EngineCore::CheckStepOutput(const StepBatch& batch, const StepOutput& output) const {
  const auto num_seqs = static_cast<size_t>(batch.num_seqs());
  const std::vector<int32_t>& row_start = output.logits_row_start;
  if (row_start.size() != num_seqs + 1 || row_start[0] != 0) {
    return absl::InternalError(StrCat("runner returned ", row_start.size(),
                                      " logits_row_start entries for ", num_seqs, " sequences"));
  }
  const bool sampled = output.sampled_tokens.size() == num_seqs;
  for (size_t i = 0; i < num_seqs; ++i) {
    const int32_t expected = batch.logits_modes[i] == LogitsMode::kAll
                                 ? batch.query_start[i + 1] - batch.query_start[i]
                             : batch.logits_modes[i] == LogitsMode::kLast ? 1
                                                                          : 0;
    if (batch.logits_modes[i] == LogitsMode::kSample &&
        (!sampled || output.sampled_tokens[i] < 0 || output.sampled_tokens[i] >= vocab_size_)) {
      return absl::InternalError(StrCat("runner returned no valid sampled token for sequence ", i));
    }
    if (row_start[i + 1] - row_start[i] != expected) {
      return absl::InternalError(StrCat("runner returned ", row_start[i + 1] - row_start[i],
                                        " logits rows for sequence ", i, ", expected ", expected));
    }
  }
  if (static_cast<int64_t>(output.logits.size()) != int64_t{row_start.back()} * vocab_size_) {
    return absl::InternalError(StrCat("runner returned ", output.logits.size(), " logits for ",
                                      row_start.back(), " rows of ", vocab_size_));
  }
  return absl::OkStatus();
}

void EngineCore::ProcessSequence(SampleState* sample, int32_t batch_index, const StepBatch& batch,
                                 const StepOutput& output, double now) {
  Sequence& seq = sample->seq;
  const int32_t num_new_tokens =
      batch.query_start[batch_index + 1] - batch.query_start[batch_index];
  const LogitsMode mode = batch.logits_modes[batch_index];
  // A chunk mid-sequence. (Read after a later step may have computed the rest: async scheduling.)
  if (mode == LogitsMode::kNone) return;
  if (mode == LogitsMode::kSample) {
    if (sample->grammar == nullptr || MaskUsable(sample, now)) {
      AppendToken(sample, output.sampled_tokens[batch_index], nullptr, now);
    }
    return;
  }
  const float* rows =
      output.logits.data() + int64_t{output.logits_row_start[batch_index]} * vocab_size_;
  if (mode == LogitsMode::kAll) {
    RecordPromptLogprobs(sample, seq.num_computed_tokens - num_new_tokens, num_new_tokens, rows);
  }
  if (seq.num_computed_tokens < seq.num_known_tokens()) return;  // a chunk mid-sequence
  const float* last_row =
      mode == LogitsMode::kAll ? rows + int64_t{num_new_tokens - 1} * vocab_size_ : rows;
  const RequestState& r = *sample->request;
  std::span<const uint32_t> allowed;
  if (sample->grammar != nullptr) {
    if (!MaskUsable(sample, now)) return;
    // Its mask, computed while the step ran (ComputeMasks).
    const auto words = static_cast<size_t>((vocab_size_ + 31) / 32);
    allowed = std::span<const uint32_t>(host_token_bitmask_)
                  .subspan(static_cast<size_t>(batch_index) * words, words);
  }
  const std::span<const int32_t> tokens(seq.tokens);
  const int32_t token_id = sampler_.Sample(
      std::span<const float>(last_row, static_cast<size_t>(vocab_size_)), r.params(),
      tokens.first(seq.num_prompt_tokens), tokens.subspan(seq.num_prompt_tokens), eos_token_ids_,
      kernels::SampleStreamKey(r.seed, static_cast<uint64_t>(seq.sample_index)),
      seq.num_known_tokens(), allowed);
  AppendToken(sample, token_id, last_row, now);
}

bool EngineCore::MaskUsable(SampleState* sample, double now) {
  const structured::GrammarMatcher& matcher = *sample->grammar;
  RequestOutput output;
  if (matcher.grammar().trie().mask_words() != (vocab_size_ + 31) / 32) {
    output.error = "structured output: the constraint was compiled for another vocabulary";
  } else if (matcher.Failed()) {
    output.error = StrCat("structured output: the ", matcher.grammar().description(),
                          " constraint exceeded its bounds on states (too ambiguous)");
  } else {
    return true;
  }
  FinishSample(sample, FinishReason::kError, now, std::move(output));
  return false;
}

void EngineCore::RecordPromptLogprobs(SampleState* sample, int32_t first_position, int32_t num_rows,
                                      const float* rows) {
  RequestState& r = *sample->request;
  if (sample->seq.sample_index != 0 || !r.owes_prompt_logprobs()) return;
  for (int32_t row = 0; row < num_rows; ++row) {
    const int32_t target = first_position + row + 1;  // the prompt position row predicts
    if (target != r.next_prompt_logprob_position || target >= r.num_prompt_tokens()) continue;
    r.prompt_logprobs.push_back(sampler_.Logprobs(
        std::span<const float>(rows + int64_t{row} * vocab_size_, static_cast<size_t>(vocab_size_)),
        r.request.prompt_token_ids[target], *r.params().prompt_logprobs));
    ++r.next_prompt_logprob_position;
  }
  if (!r.owes_prompt_logprobs()) {
    sample->seq.use_prefix_cache = true;
    sample->seq.max_tokens_per_step = 0;
  }
}

void EngineCore::AppendToken(SampleState* sample, int32_t token_id, const float* logits_row,
                             double now) {
  RequestState& r = *sample->request;
  const SamplingParams& params = r.params();
  Sequence& seq = sample->seq;
  if (sample->grammar != nullptr && !sample->grammar->AcceptToken(token_id)) {
    // Only a row whose every token was masked (min_tokens holding back the EOS that the
    // constraint requires) draws a token the constraint refuses.
    RequestOutput output;
    output.error = StrCat("structured output: token ", token_id,
                          " does not continue the constrained output");
    FinishSample(sample, FinishReason::kError, now, std::move(output));
    return;
  }
  seq.tokens.push_back(token_id);
  ++stats_.num_generated_tokens;
  if (sample->first_token_seconds < 0.0) sample->first_token_seconds = now;

  RequestOutput output;
  output.token_ids.push_back(token_id);
  output.token_times_seconds.push_back(now - r.arrival_seconds);
  if (params.logprobs.has_value()) {
    output.logprobs.push_back(
        sampler_.Logprobs(std::span<const float>(logits_row, static_cast<size_t>(vocab_size_)),
                          token_id, *params.logprobs));
  }
  if (seq.sample_index == 0 && params.prompt_logprobs.has_value() && !r.prompt_logprobs_sent) {
    output.prompt_logprobs = std::move(r.prompt_logprobs);
    r.prompt_logprobs.clear();
    r.prompt_logprobs_sent = true;
  }

  // Counted up to this token: with async scheduling a later one may be pending already.
  const int32_t num_output_tokens = seq.num_read_tokens() - seq.num_prompt_tokens;
  const bool can_stop = num_output_tokens >= params.min_tokens;
  std::optional<FinishReason> reason;
  if (can_stop && !params.ignore_eos &&
      std::find(eos_token_ids_.begin(), eos_token_ids_.end(), token_id) != eos_token_ids_.end()) {
    reason = FinishReason::kEos;
    output.stop_token_id = token_id;
  } else if (can_stop && std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(),
                                   token_id) != params.stop_token_ids.end()) {
    reason = FinishReason::kStopToken;
    output.stop_token_id = token_id;
  } else if (sample->decoder != nullptr) {
    std::optional<std::string> matched;
    output.text = sample->matcher.Push(sample->decoder->Append(token_id), can_stop, &matched);
    if (matched.has_value()) {
      reason = FinishReason::kStopString;
      output.stop_string = *std::move(matched);
    }
  }
  if (!reason.has_value() && sample->grammar != nullptr && sample->grammar->MustEnd()) {
    reason = FinishReason::kConstraintEnd;  // complete: nothing but EOS could follow
  }
  if (!reason.has_value() && seq.num_read_tokens() >= r.max_total_tokens) {
    reason =
        params.max_tokens.has_value() ? FinishReason::kMaxTokens : FinishReason::kContextLength;
  }
  if (reason.has_value()) {
    FinishSample(sample, *reason, now, std::move(output));
  } else {
    Emit(sample, std::move(output));
  }
}

void EngineCore::FinishSample(SampleState* sample, FinishReason reason, double now,
                              RequestOutput output) {
  if (sample->finished) return;
  RequestState& r = *sample->request;
  Sequence& seq = sample->seq;
  // Text still held back is released when generation ends for a reason other than a stop string
  // (an EOS or stop token's own text is never decoded).
  if (sample->decoder != nullptr && !sample->matcher.stopped() &&
      reason != FinishReason::kAborted && reason != FinishReason::kError) {
    std::optional<std::string> matched;
    output.text += sample->matcher.Push(
        sample->decoder->Finish(),
        seq.num_read_tokens() - seq.num_prompt_tokens >= r.params().min_tokens, &matched);
    if (matched.has_value()) {
      reason = FinishReason::kStopString;
      output.stop_string = *std::move(matched);
      output.stop_token_id.reset();
    } else {
      output.text += sample->matcher.Flush();
    }
  }
  output.finished = true;
  output.finish_reason = reason;
  output.usage.prompt_tokens = seq.num_prompt_tokens;
  // Tokens drawn but not read (async scheduling) were never the client's.
  output.usage.completion_tokens = seq.num_read_tokens() - seq.num_prompt_tokens;
  output.usage.cached_tokens =
      std::min(seq.num_cached_tokens_at_first_admission, seq.num_prompt_tokens);
  const double scheduled_at =
      sample->first_scheduled_seconds >= 0.0 ? sample->first_scheduled_seconds : now;
  output.timings.queue_seconds = scheduled_at - r.arrival_seconds;
  output.timings.first_token_seconds =
      sample->first_token_seconds >= 0.0 ? sample->first_token_seconds - r.arrival_seconds : 0.0;
  output.timings.finish_seconds = now - r.arrival_seconds;

  sample->finished = true;
  --r.num_unfinished_samples;
  if (r.num_unfinished_samples == 0) ++stats_.num_finished_requests;
  scheduler_.Remove(&seq);
  samples_by_seq_id_.erase(seq.seq_id);
  finished_this_step_.push_back(sample);
  Emit(sample, std::move(output));
}

void EngineCore::Emit(SampleState* sample, RequestOutput output) {
  output.request_id = sample->request->id;
  output.sample_index = sample->seq.sample_index;
  if (emitter_ != nullptr) {
    emitter_->Add(sample->request->stream, std::move(output));
  } else {
    sample->request->stream->Push(std::move(output));
  }
}

EngineStats EngineCore::Stats() const {
  EngineStats stats = stats_;
  stats.num_running_seqs = scheduler_.num_running();
  stats.num_waiting_seqs = scheduler_.num_waiting();
  stats.num_preempted_seqs = scheduler_.num_preempted();
  stats.num_unfinished_requests = static_cast<int32_t>(requests_.size());
  stats.num_kv_blocks = block_manager_.num_blocks();
  stats.num_free_kv_blocks = block_manager_.num_free_blocks();
  stats.kv_cache_usage = block_manager_.usage();
  stats.num_state_slots = state_slots_.num_slots();
  stats.num_used_state_slots = state_slots_.num_used();
  stats.kv_groups.clear();
  for (int32_t g = 0; g < block_manager_.num_groups(); ++g) {
    stats.kv_groups.push_back({.window = block_manager_.group_windows()[static_cast<size_t>(g)],
                               .num_used_blocks = block_manager_.num_used_blocks(g)});
  }
  stats.prefix_cache_queried_tokens = scheduler_.prefix_cache_queried_tokens();
  stats.prefix_cache_hit_tokens = scheduler_.prefix_cache_hit_tokens();
  stats.num_preemptions = scheduler_.num_preemptions();
  return stats;
}

}  // namespace lmserve::engine
