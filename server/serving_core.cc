#include "server/serving_core.h"

#include <algorithm>
#include <utility>

#include "common/status.h"
#include "common/strings.h"
#include "server/log.h"

namespace lmserve::server {

// ---- ServingCore
// -----------------------------------------------------------------------------------

void ServingCore::SetModel(std::unique_ptr<ServingModel> model) {
  model_ = std::move(model);
  metrics_.store(model_->metrics.get());
}

void ServingCore::SetState(ServerState state) {
  absl::MutexLock lock(&mu_);
  state_ = state;
}

ServerState ServingCore::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

absl::Status ServingCore::Authorize(std::optional<std::string_view> authorization) const {
  if (options_.auth_token.empty()) return absl::OkStatus();
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer <token>'");
  }
  // "Bearer <token>" with the scheme in any case (RFC 9110: auth schemes are case-insensitive),
  // one or more spaces after it, and exactly the token; compared in constant time, so that the
  // time taken does not depend on where it differs.
  std::string_view value = *authorization;
  constexpr std::string_view kScheme = "bearer";
  bool scheme_ok = value.size() > kScheme.size() && value[kScheme.size()] == ' ';
  for (size_t i = 0; scheme_ok && i < kScheme.size(); ++i) {
    scheme_ok = (value[i] | 0x20) == kScheme[i];  // ASCII letters to lower case
  }
  if (!scheme_ok) return absl::UnauthenticatedError("the authorization is not 'Bearer <token>'");
  value.remove_prefix(kScheme.size());
  while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  const std::string& token = options_.auth_token;
  unsigned char difference = value.size() == token.size() ? 0 : 1;
  for (size_t i = 0; i < token.size(); ++i) {
    difference |= static_cast<unsigned char>(token[i] ^ (i < value.size() ? value[i] : 0));
  }
  if (difference != 0) return absl::UnauthenticatedError("invalid bearer token");
  return absl::OkStatus();
}

absl::Status ServingCore::CheckServing() const {
  switch (state()) {
    case ServerState::kStarting:
      return absl::UnavailableError("the server is starting: the model is loading");
    case ServerState::kDraining:
    case ServerState::kStopped:
      return absl::UnavailableError("the server is shutting down");
    case ServerState::kServing:
      break;
  }
  return absl::OkStatus();
}

int ServingCore::NumCalls() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(calls_.size());
}

bool ServingCore::AwaitNoCalls(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(
      absl::Condition(
          +[](std::set<GenerationCall*>* calls) { return calls->empty(); }, &calls_),
      timeout);
}

void ServingCore::AbortAllForDrain() {
  absl::MutexLock lock(&mu_);
  for (GenerationCall* call : calls_) call->AbortRequest(/*for_drain=*/true);
}

absl::Status ServingCore::Register(GenerationCall* call) {
  absl::MutexLock lock(&mu_);
  if (state_ != ServerState::kServing) {
    return absl::UnavailableError("the server is shutting down");
  }
  // Free sequence slots first: the first max_num_seqs requests in flight run (or will at the next
  // step), whatever the engine's last step reported; only those beyond wait in the queue. Counted
  // here rather than from the engine's statistics, which lag a step behind a burst.
  const int waiting = std::max(0, num_engine_requests_ - model_->max_num_seqs);
  if (num_engine_requests_ >= model_->max_num_seqs && waiting >= options_.max_queued_requests) {
    return absl::ResourceExhaustedError(
        StrCat("the waiting queue is full (", num_engine_requests_, " requests in flight for ",
               model_->max_num_seqs, " sequence slots (--max-num-seqs), ", waiting,
               " wait; --max-queued-requests ", options_.max_queued_requests, "): retry later"));
  }
  calls_.insert(call);
  ++num_engine_requests_;
  return absl::OkStatus();
}

void ServingCore::Unregister(GenerationCall* call) {
  absl::MutexLock lock(&mu_);
  calls_.erase(call);
}

void ServingCore::EngineRequestEnded() {
  absl::MutexLock lock(&mu_);
  --num_engine_requests_;
}

// ---- GenerationCall
// --------------------------------------------------------------------------------

// Where the engine's listener finds its call. Only the call's executor reads or writes `call`.
struct GenerationCall::Mailbox {
  std::atomic<bool> scheduled{false};
  GenerationCall* call = nullptr;
};

GenerationCall::GenerationCall(ServingCore* core, FrontEnd front_end, std::string_view method)
    : core_(core), front_end_(front_end), method_(method) {}

absl::Status GenerationCall::Begin(const std::function<absl::StatusOr<PreparedRequest>()>& prepare,
                                   PostFunction post) {
  LMSERVE_RETURN_IF_ERROR(core_->CheckServing());
  LMSERVE_ASSIGN_OR_RETURN(PreparedRequest prepared, prepare());
  prepared_ = std::move(prepared);
  num_samples_ = prepared_.request.sampling.n;
  last_token_time_.assign(num_samples_, -1.0);
  LMSERVE_RETURN_IF_ERROR(core_->Register(this));
  ServingModel& model = core_->model();
  const size_t num_prompt_tokens = prepared_.request.prompt_token_ids.size();
  absl::StatusOr<engine::RequestHandle> handle = model.engine->Submit(prepared_.request);
  if (!handle.ok()) {
    core_->EngineRequestEnded();
    core_->Unregister(this);
    return handle.status();
  }
  request_id_ = handle->id;
  stream_ = handle->stream;
  response_request_id_ =
      prepared_.request_id.empty() ? StrCat("lmserve-", request_id_) : prepared_.request_id;
  if (LogText()) {
    LogInfo("request ", response_request_id_, " ", method_, ": ", num_prompt_tokens,
            " prompt tokens: ", prepared_.log_text);
  }
  // A front end may abort a submitted request from now on (gRPC calls OnCancel only after its
  // handler returns; an HTTP connection's executor is the one running this).
  submitted_.store(true);
  OnSubmitted();
  mailbox_ = std::make_shared<Mailbox>();
  mailbox_->call = this;
  std::shared_ptr<Mailbox> mailbox = mailbox_;
  // The mailbox and the response's first fields are set up before the listener can run: once it
  // is set, outputs reach Deliver on the executor at any moment, even before this returns.
  stream_->SetListener([post = std::move(post), mailbox] {
    if (mailbox->scheduled.exchange(true)) return;
    post([mailbox] {
      mailbox->scheduled.store(false);
      if (mailbox->call != nullptr) mailbox->call->OnEngineOutputs();
    });
  });
  return absl::OkStatus();
}

void GenerationCall::AbortRequest(bool for_drain, bool deadline_passed) {
  if (for_drain) {
    drain_aborted_.store(true);
  } else if (deadline_passed) {
    deadline_passed_.store(true);
  } else {
    client_aborted_.store(true);
  }
  if (submitted_.load()) core_->model().engine->Abort(request_id_);
}

void GenerationCall::Detach() {
  if (detached_) return;
  detached_ = true;
  if (mailbox_ != nullptr) mailbox_->call = nullptr;
  // The listener holds the front end's executor: it goes now, not when the engine lets go of the
  // stream.
  if (stream_ != nullptr) stream_->SetListener([] {});
  if (submitted_.load() && !all_finished()) {
    // Detached early (the front end aborted it and gave up on its last outputs): the request
    // ends within a step; it counts as ended now, its unfinished choices as aborted.
    if (Metrics* metrics = core_->metrics(); metrics != nullptr) {
      for (int32_t i = num_finished_; i < num_samples_; ++i) {
        metrics->CountFinishedChoice(engine::FinishReason::kAborted);
      }
    }
    core_->EngineRequestEnded();
  }
  core_->Unregister(this);
}

void GenerationCall::OnEngineOutputs() {
  if (detached_ || stream_ == nullptr || !ReadyForOutputs()) return;
  std::vector<engine::RequestOutput> outputs = stream_->TakeAvailable();
  if (outputs.empty()) return;
  for (const engine::RequestOutput& output : outputs) Account(output);
  if (LogText()) {
    for (const engine::RequestOutput& output : outputs) output_log_text_ += output.text;
  }
  Deliver(std::move(outputs));
}

void GenerationCall::Account(const engine::RequestOutput& output) {
  Metrics* metrics = core_->model().metrics.get();
  if (!counted_prompt_) {
    counted_prompt_ = true;
    metrics->AddPromptTokens(static_cast<int64_t>(prepared_.request.prompt_token_ids.size()));
  }
  const int32_t new_tokens = static_cast<int32_t>(output.token_ids.size());
  generation_tokens_ += new_tokens;
  metrics->AddGenerationTokens(new_tokens);
  double& last = last_token_time_[output.sample_index];
  for (double time : output.token_times_seconds) {
    if (!seen_first_token_) {
      seen_first_token_ = true;
      metrics->ObserveTimeToFirstToken(front_end_, time);
    }
    if (last >= 0) metrics->ObserveInterTokenLatency(front_end_, std::max(0.0, time - last));
    last = time;
  }
  if (!output.finished) return;
  ++num_finished_;
  metrics->CountFinishedChoice(output.finish_reason);
  if (output.finish_reason == engine::FinishReason::kError && engine_error_.empty()) {
    engine_error_ = output.error.empty() ? "engine fault" : output.error;
  }
  if (output.sample_index == 0) cached_tokens_ = output.usage.cached_tokens;
  const engine::RequestTimings& t = output.timings;
  if (!has_timings_) {
    timings_ = t;
    has_timings_ = true;
  } else {
    timings_.queue_seconds = std::min(timings_.queue_seconds, t.queue_seconds);
    timings_.finish_seconds = std::max(timings_.finish_seconds, t.finish_seconds);
    if (t.first_token_seconds > 0 && (timings_.first_token_seconds <= 0 ||
                                      t.first_token_seconds < timings_.first_token_seconds)) {
      timings_.first_token_seconds = t.first_token_seconds;
    }
  }
  if (all_finished()) {
    core_->EngineRequestEnded();
    FinishedRequestStats stats;
    stats.prompt_tokens = static_cast<int32_t>(prepared_.request.prompt_token_ids.size());
    stats.generation_tokens = generation_tokens_;
    stats.has_first_token = seen_first_token_;
    stats.timings = timings_;
    metrics->ObserveFinishedRequest(front_end_, stats);
  }
}

absl::Status GenerationCall::FinalStatus() const {
  if (drain_aborted_.load()) {
    return absl::UnavailableError(
        "the server is shutting down: the request was aborted at the end of the grace period");
  }
  if (deadline_passed_.load()) {
    return absl::DeadlineExceededError("the call's deadline expired: the request was aborted");
  }
  if (client_aborted_.load()) return absl::CancelledError("cancelled by the client");
  if (!engine_error_.empty()) {
    return absl::InternalError(StrCat("the engine failed this request: ", engine_error_));
  }
  return absl::OkStatus();
}

void GenerationCall::LogEnd(const absl::Status& status) {
  if (status.code() == absl::StatusCode::kInternal) {
    LogError("request ", response_request_id_, " ", method_, ": ", status.message());
  }
  if (LogText()) {
    LogInfo("request ", response_request_id_, " ", method_, " ended (",
            absl::StatusCodeToString(status.code()), ", ", generation_tokens_,
            " tokens): ", output_log_text_);
  }
}

}  // namespace lmserve::server
