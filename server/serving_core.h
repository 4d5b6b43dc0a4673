// What the front ends share: the gRPC service (service.cc) and the OpenAI-compatible HTTP API
// (openai_routes.cc) serve one model from one engine through this.
//
//   ServingCore     the served model, the server's state (starting, serving, draining), admission
//                   (the bearer token, readiness, the bounded waiting queue) and the registry of
//                   generation calls in flight, which a drain aborts.
//   GenerationCall  one engine request: submission, its outputs handed to the front end on the
//                   front end's own executor, the request metrics (labelled by front end), and the
//                   status it ends with.
//
// A front end only translates: its protocol's request into a PreparedRequest (request_convert.h,
// the same validation for both), the engine's outputs into its responses.
//
// Thread safety: ServingCore's methods are thread-safe. A GenerationCall's methods run on its
// executor (the `post` given to Begin: gRPC's pump thread, an HTTP connection's strand) unless
// marked otherwise.

#ifndef LMSERVE_SERVER_SERVING_CORE_H_
#define LMSERVE_SERVER_SERVING_CORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/core/engine.h"
#include "server/metrics.h"
#include "server/model_loader.h"
#include "server/request_convert.h"
#include "server/serve_config.h"

namespace lmserve::server {

enum class ServerState { kStarting, kServing, kDraining, kStopped };

// Runs `work` later, in posting order, on the executor that owns a call.
using PostFunction = std::function<void(std::function<void()> work)>;

class GenerationCall;

// The request limits of `options`: the defaults, plus the chat roles of --extra-chat-roles.
inline ApiLimits MakeApiLimits(const ServerOptions& options) {
  ApiLimits limits;
  limits.chat_roles.insert(limits.chat_roles.end(), options.extra_chat_roles.begin(),
                           options.extra_chat_roles.end());
  return limits;
}

class ServingCore {
 public:
  explicit ServingCore(const ServerOptions& options)
      : options_(options), api_limits_(MakeApiLimits(options)) {}
  ServingCore(const ServingCore&) = delete;
  ServingCore& operator=(const ServingCore&) = delete;

  // Set once, before the state becomes kServing; read-only afterwards.
  void SetModel(std::unique_ptr<ServingModel> model);
  // REQUIRES: the model is set (the state has been kServing).
  ServingModel& model() { return *model_; }
  // nullptr before the model is set.
  ServingModel* model_or_null() { return model_.get(); }
  // The model's metrics; nullptr before the model is set.
  Metrics* metrics() const { return metrics_.load(); }

  void SetState(ServerState state);
  ServerState state() const;

  const ServerOptions& options() const { return options_; }
  const ApiLimits& api_limits() const { return api_limits_; }

  // OK when no bearer token is configured, or when `authorization` (the value of the
  // `authorization` header or metadata; nullopt when absent) is "Bearer <token>". Unauthenticated
  // otherwise. The comparison takes the same time wherever the strings differ.
  absl::Status Authorize(std::optional<std::string_view> authorization) const;
  // Unavailable ("starting" or "shutting down") unless the state is kServing.
  absl::Status CheckServing() const;

  // Generation calls registered (submitted and not yet detached).
  int NumCalls() const;
  // Waits up to `timeout` for every call to be detached. Returns whether they were.
  bool AwaitNoCalls(absl::Duration timeout);
  // Aborts every registered call's request (drain): they end with status Unavailable.
  void AbortAllForDrain();

 private:
  friend class GenerationCall;
  // Registers a call about to submit a request: Unavailable when not serving, ResourceExhausted
  // when the waiting queue is full.
  absl::Status Register(GenerationCall* call);
  void Unregister(GenerationCall* call);
  // A registered call's engine request has ended (its stream finished) or was never submitted.
  void EngineRequestEnded();

  const ServerOptions& options_;
  const ApiLimits api_limits_;
  std::unique_ptr<ServingModel> model_;
  std::atomic<Metrics*> metrics_{nullptr};  // model_->metrics, readable before the model is set

  mutable absl::Mutex mu_;
  ServerState state_ ABSL_GUARDED_BY(mu_) = ServerState::kStarting;
  std::set<GenerationCall*> calls_ ABSL_GUARDED_BY(mu_);
  int num_engine_requests_ ABSL_GUARDED_BY(mu_) = 0;
};

// One engine request of a front end. The front end subclasses it: Deliver turns outputs into its
// responses. Life cycle: construct, Begin (on any thread; from then on outputs arrive through
// `post`), outputs delivered until every choice has finished, Detach (on the executor), destroy.
class GenerationCall {
 public:
  // `method` names the call in logs ("Complete", "POST /v1/completions"); it must outlive the call.
  GenerationCall(ServingCore* core, FrontEnd front_end, std::string_view method);
  virtual ~GenerationCall() = default;
  GenerationCall(const GenerationCall&) = delete;
  GenerationCall& operator=(const GenerationCall&) = delete;

  // Checks readiness, prepares the request (`prepare` runs only while serving), registers it,
  // submits it. From then on its outputs reach Deliver through `post`, possibly before Begin
  // returns. A non-OK result means nothing was submitted and nothing will be delivered.
  // Any thread; once per call.
  absl::Status Begin(const std::function<absl::StatusOr<PreparedRequest>()>& prepare,
                     PostFunction post);

  // Any thread: aborts the engine request (its choices finish as aborted, within a step).
  // `deadline_passed`: the call's deadline expired (gRPC cancels such a call as one its client
  // cancelled): it ends as DEADLINE_EXCEEDED rather than CANCELLED.
  void AbortRequest(bool for_drain, bool deadline_passed = false);

  // New outputs may be waiting: takes them unless ReadyForOutputs() says no, counts them in the
  // metrics and delivers them.
  void OnEngineOutputs();

  // No output is delivered after this, and the call leaves the registry (a drain no longer waits
  // for it). Idempotent. Call it before destroying a call that Begin submitted. REQUIRES: every
  // choice has finished, or AbortRequest was called (the request then counts as ended here).
  void Detach();

  bool submitted() const { return submitted_.load(); }
  bool all_finished() const { return num_finished_ == num_samples_; }
  const PreparedRequest& prepared() const { return prepared_; }
  engine::RequestId engine_request_id() const { return request_id_; }

  // The status the call ends with, once every choice has finished: Unavailable when a drain
  // aborted it, Cancelled when the client did, Internal when the engine failed it.
  absl::Status FinalStatus() const;

  // Counts for the usage fields.
  int32_t prompt_tokens() const {
    return static_cast<int32_t>(prepared_.request.prompt_token_ids.size());
  }
  int32_t generation_tokens() const { return generation_tokens_; }
  int32_t cached_tokens() const { return cached_tokens_; }
  const engine::RequestTimings& timings() const { return timings_; }

  // Logs the end of the call (failures always; text with --debug-log-text).
  void LogEnd(const absl::Status& status);

 protected:
  // In Begin once the request is submitted, before any output can reach Deliver: what the
  // response needs from the start. Runs on Begin's thread.
  virtual void OnSubmitted() {}
  // False leaves the outputs in the engine's stream for now (a front end applying backpressure);
  // it then calls OnEngineOutputs again when it has room.
  virtual bool ReadyForOutputs() { return true; }
  // Outputs to turn into responses, already counted in the metrics.
  virtual void Deliver(std::vector<engine::RequestOutput> outputs) = 0;

  ServingCore* const core_;
  const FrontEnd front_end_;
  const std::string_view method_;
  PreparedRequest prepared_;
  std::string response_request_id_;  // the client's request id, else "lmserve-<engine id>"
  int32_t num_samples_ = 1;

 private:
  struct Mailbox;
  void Account(const engine::RequestOutput& output);

  engine::RequestId request_id_ = 0;
  std::shared_ptr<engine::OutputStream> stream_;
  std::shared_ptr<Mailbox> mailbox_;
  int32_t num_finished_ = 0;
  std::atomic<bool> submitted_{false};
  std::atomic<bool> client_aborted_{false};
  std::atomic<bool> deadline_passed_{false};
  std::atomic<bool> drain_aborted_{false};
  bool detached_ = false;
  std::string engine_error_;
  std::string output_log_text_;  // with --debug-log-text

  // Metrics bookkeeping.
  bool counted_prompt_ = false;
  bool seen_first_token_ = false;
  std::vector<double> last_token_time_;  // per sample; < 0 before its first token
  int32_t generation_tokens_ = 0;
  int32_t cached_tokens_ = 0;
  engine::RequestTimings timings_;
  bool has_timings_ = false;
};

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_SERVING_CORE_H_
