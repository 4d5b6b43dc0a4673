// The engine core: one engine step = schedule -> run -> sample -> update -> emit.
//
// EngineCore is the single-threaded heart of the engine: it owns the runner, the block manager, the
// scheduler and the sampler, and every request's state. Engine (engine.h) runs it on its own thread
// behind a thread-safe inbox; tests drive it directly, a step at a time.
//
// Per step: the scheduler plans (allocating KV blocks, preempting when they run out); the plan
// becomes a StepBatch (each sequence's new tokens, its block table, which logits rows are needed);
// the runner computes it; the scheduler advances num_computed_tokens and caches full blocks; each
// sequence that has caught up with its known tokens gets one sampled token, which is checked
// against the stop conditions (EOS, stop tokens, stop strings, max_tokens, context length); outputs
// go to the requests' streams; finished sequences release their blocks.

#ifndef LMSERVE_ENGINE_CORE_ENGINE_CORE_H_
#define LMSERVE_ENGINE_CORE_ENGINE_CORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/core/block_manager.h"
#include "engine/core/clock.h"
#include "engine/core/output_stream.h"
#include "engine/core/request.h"
#include "engine/core/sampler.h"
#include "engine/core/scheduler.h"
#include "engine/core/text.h"
#include "engine/runner/model_runner.h"

namespace lmserve::engine {

struct EngineConfig {
  int32_t max_num_seqs = 64;                 // running sequences per step at most
  int32_t max_num_batched_tokens = 2048;     // tokens computed per step at most
  int32_t long_prefill_token_threshold = 0;  // tokens per sequence per step at most; 0: no cap
  bool enable_prefix_caching = true;
  int32_t max_model_len = 0;     // the context length; 0: the model's max_position_embeddings
  int32_t max_logprobs = 20;     // bound on sampling.logprobs and prompt_logprobs
  int32_t max_n = 64;            // bound on sampling.n
  uint64_t seed = 0;             // seeds the per-request seeds of requests that bring none
  // While sequences decode, a step that also prefills should take at most this many times a
  // decode-only step: its prefill tokens are capped at a chunk that the engine steers from the
  // measured step times (after each such step, chunk *= target / step time, the target being this
  // factor times the average decode-only step), at least kMinPrefillChunkTokens. So one long
  // prompt cannot stall every stream's tokens for the seconds its prefill takes (the CPU runner's
  // case); the prompt's own first token comes later. 0: off, the token budget alone.
  double max_step_slowdown = 0.0;
  // The logits rows of prompt logprobs one step may ask for, as bytes of fp32 rows: a prompt's
  // rows are computed chunk by chunk, never [prompt x vocabulary] at once.
  int64_t max_prompt_logits_bytes_per_step = int64_t{32} << 20;
  // Structured output: the token bitmasks of a step's constrained sequences are computed on the
  // host while the runner's forward pass runs (between ModelRunner::Launch and Finish), on this
  // many threads (the engine's and structured_mask_threads - 1 workers, kernels/cpu/parallel.h),
  // each sequence's matcher on one thread. 0: min(4, physical cores).
  int32_t structured_mask_threads = 0;
  // false: the masks are computed before the step is launched (the serial path, for comparison).
  bool overlap_structured_masks = true;
  // Outputs are pushed into their streams by a thread of the engine's own (OutputEmitter) rather
  // than by the thread that steps, which then only queues them: waking the streams' readers (a
  // front end's thread per push) leaves the time between two steps, in which the GPU waits. A
  // step's outputs are all handed over before Step (or Abort) returns, but may reach their streams
  // a moment after. The server turns it on; off, a stream holds a step's outputs when Step returns.
  bool emit_outputs_on_thread = false;
  // Async scheduling: while the runner still runs a step, the engine schedules and launches the
  // next one (ModelRunner::CanLaunchAhead), whose decodes take their input tokens from the step
  // before's draws on the device. Scheduling, the batch, the launch and the outputs of the step
  // before then overlap the GPU's work instead of coming between two steps. Only steps whose
  // every token is drawn by the runner go ahead (no logits to the host: penalties, logprobs,
  // structured output masked on the host); others finish before the next is scheduled. A
  // sequence stopped by a token the engine had not read yet has computed one more position in the
  // step after, which is dropped; a sequence's last token by its length limit is awaited instead.
  // The server turns it on for runners that can.
  bool async_scheduling = false;
  const Clock* clock = nullptr;  // not owned; nullptr: SystemClock
};

// The least prefill chunk EngineConfig::max_step_slowdown lets a step take.
inline constexpr int32_t kMinPrefillChunkTokens = 1;

// One KV cache group's share of the pool (engine/model/kv_cache_groups.h).
struct KvGroupStats {
  int32_t window = 0;           // 0: full attention
  int32_t num_used_blocks = 0;  // blocks its tables reference
};

// A snapshot for metrics.
struct EngineStats {
  int32_t num_running_seqs = 0;
  int32_t num_waiting_seqs = 0;    // preempted ones included
  int32_t num_preempted_seqs = 0;  // waiting to be recomputed after a preemption
  int32_t num_unfinished_requests = 0;
  int32_t num_kv_blocks = 0;
  int32_t num_free_kv_blocks = 0;       // unreferenced, cached content included
  double kv_cache_usage = 0.0;          // referenced fraction of the pool
  std::vector<KvGroupStats> kv_groups;  // by group; their used blocks sum to the pool's
  // Recurrent-state slots (state_slots.h): the pool (0: the model has no state-space layers)
  // and those the running sequences hold.
  int32_t num_state_slots = 0;
  int32_t num_used_state_slots = 0;
  int64_t prefix_cache_queried_tokens = 0;
  int64_t prefix_cache_hit_tokens = 0;
  int64_t num_preemptions = 0;
  int64_t num_steps = 0;
  double last_step_seconds = 0.0;
  double total_step_seconds = 0.0;
  int32_t last_step_tokens = 0;   // tokens computed in the last step
  int64_t total_step_tokens = 0;  // tokens computed in all steps (prefix hits excluded)
  int64_t num_generated_tokens = 0;
  int64_t num_finished_requests = 0;
  // EngineConfig::max_step_slowdown's state (0 until measured) and the last step's prefill
  // budget (0: none applied).
  double decode_step_seconds = 0.0;
  double prefill_chunk_tokens = 0.0;
  int32_t last_prefill_budget = 0;
  // Structured output: the wall time of the steps' token bitmasks on the host (all threads at
  // once), and the masks computed.
  double total_mask_seconds = 0.0;
  int64_t num_masks = 0;
  // The wall time in the runner's halves (ModelRunner::Launch, Finish): a GPU runner's Finish
  // waits for the step's end. With async scheduling the prepare, launch and process times below
  // overlap the step before's on the GPU, and Finish waits for the step launched ahead.
  double total_launch_seconds = 0.0;
  double total_finish_seconds = 0.0;
  // The host's work of a step before its launch (scheduling, the batch; the masks too where they
  // are not overlapped) and after its Finish (each sequence's token: grammars advanced, outputs
  // emitted; finished requests reaped): the wall time in which the GPU has nothing of this engine
  // to run.
  double total_prepare_seconds = 0.0;
  double total_process_seconds = 0.0;
};

// Whether the runner's own sampler (LogitsMode::kSample) can pick this sequence's next token
// exactly as the engine's Sampler would (no penalties, biases, logprobs or min_tokens masking;
// a structured-output constraint only when the runner applies token bitmasks, `runner_masks`).
bool RunnerCanSample(const SamplingParams& params, const Sequence& seq, bool runner_masks = false);

class EngineCore {
 public:
  // `text_decoder` may be null (no text, no stop strings). Fails on an unusable configuration.
  static absl::StatusOr<std::unique_ptr<EngineCore>> Create(
      std::unique_ptr<ModelRunner> runner, const EngineConfig& config,
      std::unique_ptr<TextDecoder> text_decoder);

  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;
  ~EngineCore();

  // What requests are validated against; immutable, so thread-safe.
  const RequestLimits& limits() const { return limits_; }
  absl::Status Validate(const Request& request) const { return ValidateRequest(request, limits_); }

  // Adds a request that passed Validate. Its outputs go to `stream` (n samples). `arrival_seconds`
  // is on the engine's clock.
  void AddRequest(RequestId id, Request request, double arrival_seconds,
                  std::shared_ptr<OutputStream> stream);
  // Finishes every unfinished sample of request `id` as kAborted and frees its blocks now.
  // No-op for an unknown or finished request.
  void Abort(RequestId id);
  // Aborts every request.
  void AbortAll();
  // With EngineConfig::emit_outputs_on_thread: returns once every output so far is in its stream,
  // and stops the emitting thread (later outputs are pushed by Emit itself). Engine calls it as it
  // shuts down, so that no push reaches a front end after Engine::Shutdown returns.
  void StopEmitter();

  // Runs one step. Returns false when there was nothing to do. With async scheduling a step may
  // return with its step still running (launched ahead): its tokens are read by the next Step.
  bool Step();
  bool HasWork() const { return scheduler_.HasWork() || ahead_.has_value(); }
  // Steps launched ahead so far (EngineConfig::async_scheduling).
  int64_t num_steps_launched_ahead() const { return num_steps_launched_ahead_; }
  EngineStats Stats() const;

  // What the last step scheduled and preempted, by id (its sequences may be gone since).
  struct StepEntry {
    RequestId request_id = 0;
    int32_t sample_index = 0;
    int32_t num_new_tokens = 0;  // 0 for preempted entries
  };
  const std::vector<StepEntry>& last_scheduled() const { return last_scheduled_; }
  const std::vector<StepEntry>& last_preempted() const { return last_preempted_; }

  // Test access.
  const Scheduler& scheduler() const { return scheduler_; }
  const BlockManager& block_manager() const { return block_manager_; }
  const ModelRunner& runner() const { return *runner_; }

 private:
  struct RequestState;
  struct SampleState;

  EngineCore(std::unique_ptr<ModelRunner> runner, const EngineConfig& config,
             std::unique_ptr<TextDecoder> text_decoder, const RequestLimits& limits);

  // The next step's prefill budget under config_.max_step_slowdown (Scheduler::Schedule).
  int32_t PrefillBudget() const;
  // The prompt tokens (chunks and recomputes) of a computed step (after OnStepComputed).
  static int32_t PrefillTokens(const SchedulerOutput& plan);
  // Folds a step's measured time into the step-time model; `prefill_budget` is the step's.
  void MeasureStep(int32_t prefill_tokens, int32_t prefill_budget, double seconds);
  void BuildBatch(const SchedulerOutput& plan);
  // Async scheduling: marks the tokens that the launched step, going ahead unfinished, draws as
  // pending in their sequences (or awaited, where one is a sequence's last).
  void MarkPendingTokens();
  // Finishes the step launched ahead: waits for it, reads its tokens, emits them.
  void FinishAhead();
  // After a step's outputs are read: its time (from `started`, its scheduling, or the end of the
  // step before if later) into the step-time model and the stats, the finished requests reaped,
  // the outputs handed to the emitter.
  void EndStep(bool ok, double started, double now, int32_t prefill_tokens, int32_t prefill_budget,
               int32_t num_tokens);
  // Reads a finished step's outputs into its sequences (those still alive, by id). An error
  // finishes them with it.
  void ProcessStep(absl::Status status, const std::vector<int64_t>& seq_ids, const StepBatch& batch,
                   const StepOutput& output, bool launched_ahead, double now);
  // The token bitmasks of mask_jobs_ (BuildBatch lists them), on mask_threads_ threads.
  void ComputeMasks();
  void FillMasks();  // ComputeMasks' work
  absl::Status CheckStepOutput(const StepBatch& batch, const StepOutput& output) const;
  // Whether a constrained sequence's mask of this step is usable; if not (a constraint of
  // another vocabulary, a matcher past its bounds), finishes it with the error.
  bool MaskUsable(SampleState* sample, double now);
  // Consumes the logits rows (or drawn token) of the sequence at `batch_index` of `batch`.
  void ProcessSequence(SampleState* sample, int32_t batch_index, const StepBatch& batch,
                       const StepOutput& output, double now);
  void RecordPromptLogprobs(SampleState* sample, int32_t first_position, int32_t num_rows,
                            const float* rows);
  void AppendToken(SampleState* sample, int32_t token_id, const float* logits_row, double now);
  void FinishSample(SampleState* sample, FinishReason reason, double now, RequestOutput output);
  void Emit(SampleState* sample, RequestOutput output);
  // Destroys the requests whose every sample has finished.
  void ReapFinishedRequests();

  const EngineConfig config_;
  const Clock* const clock_;
  const RequestLimits limits_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<TextDecoder> text_decoder_;
  std::vector<int32_t> eos_token_ids_;
  int64_t vocab_size_ = 0;

  BlockManager block_manager_;
  StateSlotPool state_slots_;  // the runner's num_state_slots (0: none)
  Scheduler scheduler_;
  Sampler sampler_;
  uint64_t seed_state_;

  absl::flat_hash_map<RequestId, std::unique_ptr<RequestState>> requests_;
  absl::flat_hash_map<int64_t, SampleState*> samples_by_seq_id_;
  int64_t next_seq_id_ = 0;
  int64_t next_arrival_order_ = 0;

  // Per-step buffers, reused.
  SchedulerOutput last_schedule_;  // pointers valid during Step() only
  std::vector<StepEntry> last_scheduled_;
  std::vector<StepEntry> last_preempted_;
  // Two batches and outputs, alternating: one may belong to a step launched ahead while the next
  // is built. batch_ and step_output_ point at the step being built and launched.
  StepBatch batches_[2];
  StepOutput step_outputs_[2];
  StepBatch* batch_ = &batches_[0];
  StepOutput* step_output_ = &step_outputs_[0];
  std::vector<int64_t> step_seq_ids_;                   // batch_'s sequences' ids, by batch index
  std::vector<std::span<const int32_t>> group_tables_;  // one sequence's, while building batch_
  std::vector<int32_t> pending_step_tokens_;  // one sequence's new tokens, while building batch_
  // Async scheduling: the step launched ahead and not yet finished.
  struct AheadStep {
    StepBatch* batch = nullptr;
    StepOutput* output = nullptr;
    std::vector<int64_t> seq_ids;  // by batch index: they may finish before it is read
    double started_seconds = 0.0;  // when it was scheduled
    int32_t prefill_tokens = 0;
    int32_t prefill_budget = 0;
    int32_t num_tokens = 0;
  };
  std::optional<AheadStep> ahead_;
  int64_t num_steps_launched_ahead_ = 0;
  double last_step_end_seconds_ = 0.0;            // when the last step's Finish returned
  std::vector<SampleState*> finished_this_step_;  // finished since the last reap
  // The step's constrained sequences that draw a token. Each one's mask goes to its row of
  // batch_.token_bitmask when the runner masks it, else to its row of host_token_bitmask_.
  struct MaskJob {
    SampleState* sample = nullptr;
    int32_t batch_index = 0;
    bool on_runner = false;
  };
  std::vector<MaskJob> mask_jobs_;
  std::vector<uint32_t> host_token_bitmask_;  // [num_seqs, words]: rows the engine's sampler uses
  std::vector<uint32_t> spare_token_bitmask_;  // batch_.token_bitmask's storage between steps

  EngineStats stats_;

  // The state of max_step_slowdown: a decode-only step's time (an average that follows the
  // latest steps) and the prefill chunk steered toward the target step time (0: not measured).
  double decode_step_seconds_ = 0.0;
  double prefill_chunk_tokens_ = 0.0;
  int32_t max_prompt_logits_rows_ = 1;  // rows of prompt logprobs per step
  int32_t mask_threads_ = 1;            // EngineConfig::structured_mask_threads, resolved
  // EngineConfig::emit_outputs_on_thread's thread (null: outputs pushed by Emit itself); last, so
  // that it is destroyed first, pushing what it still holds.
  std::unique_ptr<OutputEmitter> emitter_;
};

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_CORE_ENGINE_CORE_H_
