#include "server/service.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/server_interceptor.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/file.h"
#include "common/status.h"
#include "common/strings.h"
#include "common/utf8.h"
#include "engine/core/engine.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "lmserve/v1/lmserve.grpc.pb.h"
#include "server/grpc_status.h"
#include "server/http_server.h"
#include "server/log.h"
#include "server/metrics.h"
#include "server/model_loader.h"
#include "server/model_text.h"
#include "server/openai_routes.h"
#include "server/request_convert.h"
#include "server/serving_core.h"
#include "server/tls_check.h"

namespace lmserve::server {
namespace {

namespace health = ::grpc::health::v1;

constexpr std::string_view kServiceName = "lmserve.v1.Lmserve";

// gRPC's core takes messages up to this many times --max-request-bytes, so that one over the limit
// by up to this factor reaches Admit, which refuses and counts it; a larger one is refused by the
// core, RESOURCE_EXHAUSTED before any code of ours sees the call, and is not counted.
constexpr int64_t kGrpcCoreRequestBytesFactor = 2;

// ---- The one conversion from absl::Status to grpc::Status ------------------------------------------

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share their numbering (both are google.rpc.Code).
  const int code = static_cast<int>(status.code());
  const grpc::StatusCode grpc_code =
      code >= 0 && code <= 16 ? static_cast<grpc::StatusCode>(code) : grpc::StatusCode::UNKNOWN;
  return grpc::Status(grpc_code, std::string(status.message()));
}

// ---- The pump: one thread that runs every call's response work, in posting order ------------------

class Pump {
 public:
  Pump() : thread_([this] { Loop(); }) {}
  ~Pump() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  void Post(std::function<void()> work) {
    absl::MutexLock lock(&mu_);
    queue_.push_back(std::move(work));
  }

 private:
  void Loop() {
    std::deque<std::function<void()>> batch;
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(
            +[](Pump* pump) ABSL_NO_THREAD_SAFETY_ANALYSIS {
              return pump->stop_ || !pump->queue_.empty();
            },
            this));
        if (queue_.empty() && stop_) return;
        batch.swap(queue_);
      }
      for (auto& work : batch) work();
      batch.clear();
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the fields above
};

// ---- grpc.health.v1.Health -------------------------------------------------------------------------

// The standard health service, ours rather than gRPC's default one so that it says NOT_SERVING from
// the first instant (the default starts out SERVING). Knows "" (the server) and lmserve.v1.Lmserve.
class HealthService final : public health::Health::CallbackService {
 public:
  void SetServing(bool serving) {
    absl::MutexLock lock(&mu_);
    serving_ = serving;
    for (Watcher* watcher : watchers_) watcher->Update(Status());
  }
  // Ends every Watch (at shutdown).
  void Shutdown() {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    serving_ = false;
    for (Watcher* watcher : watchers_) watcher->End();
  }

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const health::HealthCheckRequest* request,
                                  health::HealthCheckResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (!Known(request->service())) {
      reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service"));
      return reactor;
    }
    {
      absl::MutexLock lock(&mu_);
      response->set_status(Status());
    }
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerWriteReactor<health::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context, const health::HealthCheckRequest* request) override {
    auto* watcher = new Watcher(this, Known(request->service()));
    absl::MutexLock lock(&mu_);
    watchers_.insert(watcher);
    if (shutdown_) {
      watcher->End();
    } else {
      watcher->Update(watcher->known() ? Status() : health::HealthCheckResponse::SERVICE_UNKNOWN);
    }
    return watcher;
  }

 private:
  class Watcher final : public grpc::ServerWriteReactor<health::HealthCheckResponse> {
   public:
    Watcher(HealthService* service, bool known) : service_(service), known_(known) {}
    bool known() const { return known_; }
    // Sends `status` when it differs from the last one sent. Holds service_->mu_.
    void Update(health::HealthCheckResponse::ServingStatus status) {
      if (!known_ && status != health::HealthCheckResponse::SERVICE_UNKNOWN) return;
      absl::MutexLock lock(&mu_);
      pending_ = status;
      MaybeWrite();
    }
    void End() {
      absl::MutexLock lock(&mu_);
      ending_ = true;
      MaybeWrite();
    }
    void OnWriteDone(bool ok) override {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) ending_ = true;
      MaybeWrite();
    }
    void OnCancel() override { End(); }
    void OnDone() override {
      {
        absl::MutexLock lock(&service_->mu_);
        service_->watchers_.erase(this);
      }
      delete this;
    }

   private:
    void MaybeWrite() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (writing_ || finished_) return;
      if (ending_) {
        finished_ = true;
        Finish(grpc::Status::OK);
        return;
      }
      if (pending_ == sent_) return;
      sent_ = pending_;
      response_.set_status(static_cast<health::HealthCheckResponse::ServingStatus>(sent_));
      writing_ = true;
      StartWrite(&response_);
    }

    HealthService* const service_;
    const bool known_;
    absl::Mutex mu_;
    int pending_ ABSL_GUARDED_BY(mu_) = -1;
    int sent_ ABSL_GUARDED_BY(mu_) = -1;
    bool writing_ ABSL_GUARDED_BY(mu_) = false;
    bool ending_ ABSL_GUARDED_BY(mu_) = false;
    bool finished_ ABSL_GUARDED_BY(mu_) = false;
    health::HealthCheckResponse response_ ABSL_GUARDED_BY(mu_);
  };

  static bool Known(const std::string& service) {
    return service.empty() || service == kServiceName;
  }
  health::HealthCheckResponse::ServingStatus Status() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return serving_ ? health::HealthCheckResponse::SERVING
                    : health::HealthCheckResponse::NOT_SERVING;
  }

  absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::set<Watcher*> watchers_ ABSL_GUARDED_BY(mu_);
};

// ---- lmserve.v1.Lmserve ----------------------------------------------------------------------------

// The lmserve.v1.Lmserve service: the RPCs over the serving core.
class LmserveService final : public v1::Lmserve::CallbackService {
 public:
  LmserveService(ServingCore* core, Pump* pump) : core_(core), pump_(pump) {}

  ServingCore* core() const { return core_; }
  Pump* pump() const { return pump_; }

  // Authorization, the request's size and readiness for every Lmserve method.
  absl::Status Admit(grpc::CallbackServerContext* context,
                     const google::protobuf::MessageLite& request, bool needs_model) const;

  // Finishes `reactor` with `status`, counted in the metrics.
  void FinishUnary(std::string_view method, grpc::ServerUnaryReactor* reactor,
                   const absl::Status& status) {
    const grpc::Status grpc_status = ToGrpcStatus(status);
    CountRpc(method, grpc_status.error_code());
    reactor->Finish(grpc_status);
  }
  void CountRpc(std::string_view method, grpc::StatusCode code) {
    if (Metrics* metrics = core_->metrics(); metrics != nullptr) {
      metrics->CountRpc(method, GrpcCodeName(code));
    }
  }

  // ---- The RPCs ----
  grpc::ServerUnaryReactor* Complete(grpc::CallbackServerContext* context,
                                     const v1::CompleteRequest* request,
                                     v1::CompleteResponse* response) override;
  grpc::ServerWriteReactor<v1::CompleteStreamResponse>* CompleteStream(
      grpc::CallbackServerContext* context, const v1::CompleteRequest* request) override;
  grpc::ServerUnaryReactor* Chat(grpc::CallbackServerContext* context,
                                 const v1::ChatRequest* request,
                                 v1::CompleteResponse* response) override;
  grpc::ServerWriteReactor<v1::CompleteStreamResponse>* ChatStream(
      grpc::CallbackServerContext* context, const v1::ChatRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* GetServerStatus(grpc::CallbackServerContext* context,
                                            const v1::GetServerStatusRequest* request,
                                            v1::ServerStatus* response) override;

 private:
  ServingCore* const core_;
  Pump* const pump_;
};

absl::Status LmserveService::Admit(grpc::CallbackServerContext* context,
                                   const google::protobuf::MessageLite& request,
                                   bool needs_model) const {
  std::optional<std::string_view> authorization;
  const auto& metadata = context->client_metadata();
  const auto [first, last] = metadata.equal_range("authorization");
  if (first != last) {
    if (std::next(first) != last) {
      // Which one a proxy or a peer would read is anyone's guess: refuse rather than pick one.
      return absl::UnauthenticatedError("more than one 'authorization' metadata entry");
    }
    authorization = std::string_view(first->second.data(), first->second.size());
  }
  LMSERVE_RETURN_IF_ERROR(core_->Authorize(authorization));
  // --max-request-bytes is checked here rather than by gRPC's core, which refuses a larger
  // message before any code of ours sees the call (uncounted); the core's own limit is
  // kGrpcCoreRequestBytesFactor times ours (LmserveServer::Start).
  const size_t bytes = request.ByteSizeLong();
  if (const int64_t limit = core_->options().max_request_bytes;
      static_cast<int64_t>(bytes) > limit) {
    return absl::ResourceExhaustedError(StrCat("the request message is ", bytes,
                                               " bytes, more than --max-request-bytes (", limit,
                                               ")"));
  }
  if (needs_model) LMSERVE_RETURN_IF_ERROR(core_->CheckServing());
  return absl::OkStatus();
}

// A Complete, CompleteStream, Chat or ChatStream call: one engine request (serving_core.h) whose
// outputs become responses on the pump thread. Subclasses are the gRPC reactors; they are deleted
// on the pump thread after gRPC's OnDone.
class GrpcGenerationCall : public GenerationCall {
 public:
  GrpcGenerationCall(LmserveService* service, std::string_view method)
      : GenerationCall(service->core(), FrontEnd::kGrpc, method), service_(service) {}

  // Handler thread: admits, prepares, submits. A non-OK result means nothing was submitted (the
  // caller finishes the reactor with it).
  absl::Status Begin(grpc::CallbackServerContext* context,
                     const google::protobuf::MessageLite& request,
                     const std::function<absl::StatusOr<PreparedRequest>()>& prepare) {
    context_ = context;
    LMSERVE_RETURN_IF_ERROR(service_->Admit(context, request, /*needs_model=*/true));
    Pump* pump = service_->pump();
    return GenerationCall::Begin(prepare, [pump](std::function<void()> work) {
      pump->Post(std::move(work));
    });
  }

  // Pump thread, after gRPC's OnDone: forgets the call.
  void Destroy() {
    Detach();
    delete this;
  }

 protected:
  void FillUsageAndTimings(v1::Usage* usage, v1::Timings* timings) const {
    usage->set_prompt_tokens(prompt_tokens());
    usage->set_completion_tokens(generation_tokens());
    usage->set_cached_tokens(cached_tokens());
    timings->set_queue_seconds(this->timings().queue_seconds);
    timings->set_time_to_first_token_seconds(this->timings().first_token_seconds);
    timings->set_total_seconds(this->timings().finish_seconds);
  }

  // Aborts the engine request of a call gRPC cancelled: by its client, or because its deadline
  // expired (which gRPC reports alike; the deadline tells which). A client whose deadline expires
  // cancels the stream itself, and that cancel can arrive just before the server's copy of the
  // deadline (which starts when the call arrives) has passed: a cancel within kDeadlineSlack of the
  // deadline counts as the deadline's.
  void AbortCancelled() {
    static constexpr auto kDeadlineSlack = std::chrono::milliseconds(250);
    const bool deadline_passed =
        context_ != nullptr &&
        context_->deadline() <= std::chrono::system_clock::now() + kDeadlineSlack;
    AbortRequest(/*for_drain=*/false, deadline_passed);
  }

  LmserveService* const service_;
  // Set by Begin; gRPC's, valid until OnDone.
  const grpc::CallbackServerContext* context_ = nullptr;
};

// Complete and Chat.
class UnaryCall final : public grpc::ServerUnaryReactor, public GrpcGenerationCall {
 public:
  UnaryCall(LmserveService* service, std::string_view method, v1::CompleteResponse* response)
      : GrpcGenerationCall(service, method), response_(response) {}

  // Handler thread.
  void Start(grpc::CallbackServerContext* context, const google::protobuf::MessageLite& request,
             const std::function<absl::StatusOr<PreparedRequest>()>& prepare) {
    absl::Status status = Begin(context, request, prepare);
    if (!status.ok()) service_->FinishUnary(method_, this, status);
  }

  void OnCancel() override { AbortCancelled(); }
  void OnDone() override {
    service_->pump()->Post([this] { Destroy(); });
  }

 private:
  void OnSubmitted() override {
    response_->set_request_id(response_request_id_);
    response_->set_model(core_->model().info.name());
    for (int i = 0; i < num_samples_; ++i) response_->add_choices()->set_index(i);
  }

  void Deliver(std::vector<engine::RequestOutput> outputs) override {
    const ModelText& text = *core_->model().text;
    for (engine::RequestOutput& output : outputs) {
      v1::Choice* choice = response_->mutable_choices(output.sample_index);
      if (prepared_.echo && !echoed_[output.sample_index]) {
        echoed_[output.sample_index] = true;
        choice->mutable_text()->insert(0, prepared_.echo_text);
      }
      choice->mutable_text()->append(output.text);
      choice->mutable_token_ids()->Add(output.token_ids.begin(), output.token_ids.end());
      for (const engine::PositionLogprobs& logprobs : output.logprobs) {
        ToProtoLogprobs(logprobs, text, choice->add_logprobs());
      }
      for (const engine::PositionLogprobs& logprobs : output.prompt_logprobs) {
        ToProtoLogprobs(logprobs, text, response_->add_prompt_logprobs());
      }
      if (output.finished) {
        choice->set_finish_reason(ToProtoFinishReason(output.finish_reason));
        choice->set_stop_reason(StopReason(output));
      }
    }
    if (!all_finished()) return;
    FillUsageAndTimings(response_->mutable_usage(), response_->mutable_timings());
    const absl::Status status = FinalStatus();
    LogEnd(status);
    service_->FinishUnary(method_, this, status);
  }

  v1::CompleteResponse* const response_;
  std::map<int32_t, bool> echoed_;
};

// CompleteStream and ChatStream.
class StreamCall final : public grpc::ServerWriteReactor<v1::CompleteStreamResponse>,
                         public GrpcGenerationCall {
 public:
  StreamCall(LmserveService* service, std::string_view method)
      : GrpcGenerationCall(service, method) {}

  // Handler thread.
  void Start(grpc::CallbackServerContext* context, const google::protobuf::MessageLite& request,
             const std::function<absl::StatusOr<PreparedRequest>()>& prepare) {
    absl::Status status = Begin(context, request, prepare);
    if (!status.ok()) {
      const grpc::Status grpc_status = ToGrpcStatus(status);
      service_->CountRpc(method_, grpc_status.error_code());
      finished_ = true;
      Finish(grpc_status);
    }
  }

  void OnWriteDone(bool ok) override {
    service_->pump()->Post([this, ok] {
      writing_ = false;
      if (!ok && !broken_) {
        // The client is gone: stop generating, drop what is queued.
        broken_ = true;
        to_write_.clear();
        AbortCancelled();
      }
      TryWrite();
    });
  }
  void OnCancel() override { AbortCancelled(); }
  void OnDone() override {
    service_->pump()->Post([this] { Destroy(); });
  }

 private:
  void Deliver(std::vector<engine::RequestOutput> outputs) override {
    const ModelText& text = *core_->model().text;
    if (!broken_) {
      for (engine::RequestOutput& output : outputs) {
        v1::CompleteStreamResponse* message = PendingMessage(output.sample_index);
        message->mutable_text()->append(output.text);
        message->mutable_token_ids()->Add(output.token_ids.begin(), output.token_ids.end());
        for (const engine::PositionLogprobs& logprobs : output.logprobs) {
          ToProtoLogprobs(logprobs, text, message->add_logprobs());
        }
        for (const engine::PositionLogprobs& logprobs : output.prompt_logprobs) {
          ToProtoLogprobs(logprobs, text, message->add_prompt_logprobs());
        }
        if (output.finished) {
          message->set_finish_reason(ToProtoFinishReason(output.finish_reason));
          message->set_stop_reason(StopReason(output));
        }
      }
      if (all_finished() && !to_write_.empty()) {
        v1::CompleteStreamResponse& last = to_write_.back();
        FillUsageAndTimings(last.mutable_usage(), last.mutable_timings());
      }
    }
    TryWrite();
  }

  // The queued message of choice `index` that new output may extend, or a new one. Merging only
  // into the newest queued message of the choice keeps each choice's order.
  v1::CompleteStreamResponse* PendingMessage(int32_t index) {
    for (auto it = to_write_.rbegin(); it != to_write_.rend(); ++it) {
      if (it->index() == index) {
        if (it->finish_reason() == v1::FINISH_REASON_UNSPECIFIED) return &*it;
        break;
      }
    }
    v1::CompleteStreamResponse& message = to_write_.emplace_back();
    message.set_request_id(response_request_id_);
    message.set_index(index);
    if (prepared_.echo && !echoed_[index]) {
      echoed_[index] = true;
      message.set_text(prepared_.echo_text);
    }
    return &message;
  }

  // Pump thread: starts the next write, or finishes the stream once everything is written.
  void TryWrite() {
    if (writing_ || finished_) return;
    if (!to_write_.empty()) {
      in_flight_ = std::move(to_write_.front());
      to_write_.pop_front();
      writing_ = true;
      StartWrite(&in_flight_);
      return;
    }
    if (!all_finished()) return;
    finished_ = true;
    const absl::Status status = FinalStatus();
    LogEnd(status);
    const grpc::Status grpc_status = ToGrpcStatus(status);
    service_->CountRpc(method_, grpc_status.error_code());
    Finish(grpc_status);
  }

  std::deque<v1::CompleteStreamResponse> to_write_;
  v1::CompleteStreamResponse in_flight_;  // valid until OnWriteDone
  std::map<int32_t, bool> echoed_;
  bool writing_ = false;
  bool broken_ = false;
  bool finished_ = false;
};

grpc::ServerUnaryReactor* LmserveService::Complete(grpc::CallbackServerContext* context,
                                                   const v1::CompleteRequest* request,
                                                   v1::CompleteResponse* response) {
  auto* call = new UnaryCall(this, "Complete", response);
  call->Start(context, *request, [this, request] {
    return PrepareCompleteRequest(*request, *core_->model().text,
                                  core_->model().engine->limits(), core_->api_limits());
  });
  return call;
}

grpc::ServerWriteReactor<v1::CompleteStreamResponse>* LmserveService::CompleteStream(
    grpc::CallbackServerContext* context, const v1::CompleteRequest* request) {
  auto* call = new StreamCall(this, "CompleteStream");
  call->Start(context, *request, [this, request] {
    return PrepareCompleteRequest(*request, *core_->model().text,
                                  core_->model().engine->limits(), core_->api_limits());
  });
  return call;
}

grpc::ServerUnaryReactor* LmserveService::Chat(grpc::CallbackServerContext* context,
                                               const v1::ChatRequest* request,
                                               v1::CompleteResponse* response) {
  auto* call = new UnaryCall(this, "Chat", response);
  call->Start(context, *request, [this, request] {
    return PrepareChatRequest(*request, *core_->model().text, core_->model().engine->limits(),
                              core_->api_limits());
  });
  return call;
}

grpc::ServerWriteReactor<v1::CompleteStreamResponse>* LmserveService::ChatStream(
    grpc::CallbackServerContext* context, const v1::ChatRequest* request) {
  auto* call = new StreamCall(this, "ChatStream");
  call->Start(context, *request, [this, request] {
    return PrepareChatRequest(*request, *core_->model().text, core_->model().engine->limits(),
                              core_->api_limits());
  });
  return call;
}

grpc::ServerUnaryReactor* LmserveService::Tokenize(grpc::CallbackServerContext* context,
                                                   const v1::TokenizeRequest* request,
                                                   v1::TokenizeResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status = Admit(context, *request, /*needs_model=*/true);
  if (status.ok()) {
    absl::StatusOr<std::vector<int32_t>> ids = TokenizeText(
        "text", request->text(),
        request->has_add_special_tokens() ? request->add_special_tokens() : true,
        *core_->model().text);
    if (ids.ok()) {
      response->mutable_token_ids()->Add(ids->begin(), ids->end());
    } else {
      status = ids.status();
    }
  }
  FinishUnary("Tokenize", reactor, status);
  return reactor;
}

grpc::ServerUnaryReactor* LmserveService::Detokenize(grpc::CallbackServerContext* context,
                                                     const v1::DetokenizeRequest* request,
                                                     v1::DetokenizeResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status = Admit(context, *request, /*needs_model=*/true);
  if (status.ok()) {
    const std::vector<int32_t> ids(request->token_ids().begin(), request->token_ids().end());
    absl::StatusOr<std::string> text =
        DetokenizeIds("token_ids", ids, request->skip_special_tokens(), *core_->model().text,
                      core_->model().engine->limits().vocab_size);
    if (text.ok()) {
      response->set_text(*std::move(text));
    } else {
      status = text.status();
    }
  }
  FinishUnary("Detokenize", reactor, status);
  return reactor;
}

grpc::ServerUnaryReactor* LmserveService::GetModelInfo(grpc::CallbackServerContext* context,
                                                       const v1::GetModelInfoRequest* request,
                                                       v1::ModelInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status = Admit(context, *request, /*needs_model=*/true);
  if (status.ok()) *response = core_->model().info;
  FinishUnary("GetModelInfo", reactor, status);
  return reactor;
}

grpc::ServerUnaryReactor* LmserveService::GetServerStatus(grpc::CallbackServerContext* context,
                                                          const v1::GetServerStatusRequest* request,
                                                          v1::ServerStatus* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status = Admit(context, *request, /*needs_model=*/false);
  if (status.ok()) {
    const ServerState current = core_->state();
    response->set_ready(current == ServerState::kServing);
    response->set_draining(current == ServerState::kDraining || current == ServerState::kStopped);
    response->set_num_requests_in_flight(core_->NumCalls());
    if (current != ServerState::kStarting && core_->model_or_null() != nullptr) {
      const engine::EngineStats stats = core_->model().engine->Stats();
      response->set_num_requests_running(stats.num_running_seqs);
      response->set_num_requests_waiting(stats.num_waiting_seqs);
      response->set_kv_cache_usage(stats.kv_cache_usage);
      response->set_kv_blocks_total(stats.num_kv_blocks);
      response->set_kv_blocks_free(stats.num_free_kv_blocks);
      response->set_state_slots_total(stats.num_state_slots);
      response->set_state_slots_used(stats.num_used_state_slots);
      for (const engine::KvGroupStats& group : stats.kv_groups) {
        v1::KvCacheGroupStatus* out = response->add_kv_groups();
        out->set_window(group.window);
        out->set_used_blocks(group.num_used_blocks);
      }
    }
  }
  FinishUnary("GetServerStatus", reactor, status);
  return reactor;
}

// ---- Calls that never reach a handler ---------------------------------------------------------

// gRPC answers a request body that does not parse as the method's message with UNIMPLEMENTED and
// no message, before any handler runs (so the call was not counted either). This interceptor sees
// the failed parse (no received message) and turns that answer into INVALID_ARGUMENT saying so,
// counted in the metrics under the method's name.
class BadBodyInterceptor final : public grpc::experimental::Interceptor {
 public:
  BadBodyInterceptor(LmserveService* service, std::string_view method)
      : service_(service), method_(method) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsed_ = true;
    }
    if (unparsed_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status(
          grpc::StatusCode::INVALID_ARGUMENT,
          StrCat("the request body is not a valid protobuf message for ", method_));
      methods->ModifySendStatus(status);
      if (service_ != nullptr) service_->CountRpc(ShortName(method_), status.error_code());
    }
    methods->Proceed();
  }

 private:
  // "/lmserve.v1.Lmserve/Complete" -> "Complete", the metrics' method label.
  static std::string_view ShortName(std::string_view method) {
    const size_t slash = method.rfind('/');
    return slash == std::string_view::npos ? method : method.substr(slash + 1);
  }

  LmserveService* const service_;  // null for other services: not counted
  const std::string method_;
  bool unparsed_ = false;
};

class BadBodyInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit BadBodyInterceptorFactory(LmserveService* service) : service_(service) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    // Only calls of one request message, read before the handler runs; in client or bidi
    // streams a missing message is the stream's end.
    using Type = grpc::experimental::ServerRpcInfo::Type;
    if (info->type() != Type::UNARY && info->type() != Type::SERVER_STREAMING) return nullptr;
    const std::string_view method = info->method() == nullptr ? "" : info->method();
    const bool ours = method.substr(0, kServiceName.size() + 1) == StrCat("/", kServiceName);
    return new BadBodyInterceptor(ours ? service_ : nullptr, method);
  }

 private:
  LmserveService* const service_;
};

// The bytes of the PEM file of `flag`.
absl::StatusOr<std::string> ReadPemFile(std::string_view flag, const std::string& path) {
  absl::StatusOr<std::string> contents = ReadFile(path);
  if (!contents.ok()) {
    return absl::InvalidArgumentError(StrCat("--", flag, ": ", contents.status().message()));
  }
  return contents;
}

}  // namespace

struct LmserveServer::Impl {
  explicit Impl(const ServerOptions& server_options)
      : options(server_options), core(options), service(&core, &pump), routes(&core) {}

  ServerOptions options;
  ServingCore core;  // first: the front ends below use it until they are gone
  Pump pump;         // before the service and the server: they post to it
  LmserveService service;
  HealthService health;
  std::unique_ptr<grpc::Server> server;
  OpenAiRoutes routes;
  std::unique_ptr<HttpServer> http;  // with --http-port
  int port = -1;
  bool drained = false;
};

absl::StatusOr<std::unique_ptr<LmserveServer>> LmserveServer::Start(const ServerOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (!options.tls_cert_file.empty()) {
    LMSERVE_ASSIGN_OR_RETURN(std::string cert, ReadPemFile("tls-cert", options.tls_cert_file));
    LMSERVE_ASSIGN_OR_RETURN(std::string key, ReadPemFile("tls-key", options.tls_key_file));
    LMSERVE_RETURN_IF_ERROR(CheckTlsKeyPair(cert, key));
    grpc::SslServerCredentialsOptions ssl_options(
        options.tls_client_ca_file.empty()
            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    if (!options.tls_client_ca_file.empty()) {
      LMSERVE_ASSIGN_OR_RETURN(ssl_options.pem_root_certs,
                               ReadPemFile("tls-client-ca", options.tls_client_ca_file));
    }
    ssl_options.pem_key_cert_pairs.push_back({std::move(key), std::move(cert)});
    credentials = grpc::SslServerCredentials(ssl_options);
  } else {
    credentials = grpc::InsecureServerCredentials();
  }

  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = ListenAddress(options.host, options.port);
  builder.AddListeningPort(address, credentials, &impl->port);
  // gRPC's core refuses a larger message before any code of ours sees the call, so it could not
  // be counted; it gets room beyond --max-request-bytes, which Admit checks and counts.
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<int64_t>(options.max_request_bytes * kGrpcCoreRequestBytesFactor, INT32_MAX)));
  builder.RegisterService(&impl->service);
  builder.RegisterService(&impl->health);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<BadBodyInterceptorFactory>(&impl->service));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || impl->port <= 0) {
    return absl::UnavailableError(StrCat("--port: cannot listen on ", address));
  }
  const std::string security =
      StrCat(options.tls_cert_file.empty() ? "" : ", TLS",
             options.tls_client_ca_file.empty() ? "" : " with client certificates",
             options.auth_token.empty() ? "" : ", bearer token");
  LogInfo("listening on ", ListenAddress(options.host, impl->port), " (gRPC", security, ")");

  if (options.http_port >= 0) {
    HttpServerOptions http;
    http.host = options.host;
    http.port = options.http_port;
    http.num_threads = options.http_threads;
    http.max_body_bytes = static_cast<size_t>(options.max_request_bytes);
    http.idle_timeout_seconds = options.http_idle_timeout_seconds;
    http.write_timeout_seconds = options.http_idle_timeout_seconds;
    if (!options.tls_cert_file.empty()) {
      LMSERVE_ASSIGN_OR_RETURN(http.cert_pem, ReadPemFile("tls-cert", options.tls_cert_file));
      LMSERVE_ASSIGN_OR_RETURN(http.key_pem, ReadPemFile("tls-key", options.tls_key_file));
      if (!options.tls_client_ca_file.empty()) {
        LMSERVE_ASSIGN_OR_RETURN(http.client_ca_pem,
                                 ReadPemFile("tls-client-ca", options.tls_client_ca_file));
      }
    }
    OpenAiRoutes* routes = &impl->routes;
    LMSERVE_ASSIGN_OR_RETURN(
        impl->http,
        HttpServer::Start(http, [routes](HttpRequest request, HttpResponder* responder) {
          return routes->Handle(std::move(request), responder);
        }));
    LogInfo("HTTP API (OpenAI-compatible) on ", options.tls_cert_file.empty() ? "http" : "https",
            "://", ListenAddress(options.host, impl->http->port()), "/v1 (", options.http_threads,
            " threads", security, ")");
  }
  return std::unique_ptr<LmserveServer>(new LmserveServer(std::move(impl)));
}

LmserveServer::LmserveServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

LmserveServer::~LmserveServer() {
  if (!impl_->drained) Drain(absl::ZeroDuration());
}

int LmserveServer::port() const { return impl_->port; }

int LmserveServer::http_port() const {
  return impl_->http == nullptr ? -1 : impl_->http->port();
}

int LmserveServer::metrics_port() const {
  const ServingModel* model = impl_->core.model_or_null();
  return model == nullptr ? -1 : model->metrics->port();
}

const ApiLimits& LmserveServer::api_limits() const { return impl_->core.api_limits(); }

void LmserveServer::Serve(std::unique_ptr<ServingModel> model) {
  impl_->core.SetModel(std::move(model));
  impl_->core.SetState(ServerState::kServing);
  impl_->health.SetServing(true);
  LogInfo("SERVING");
}

void LmserveServer::Drain(absl::Duration grace, const std::function<bool()>& hurry) {
  Impl& impl = *impl_;
  if (impl.drained) return;
  impl.drained = true;
  impl.core.SetState(ServerState::kDraining);
  impl.health.SetServing(false);
  const int in_flight = impl.core.NumCalls();
  LogInfo("draining: ", in_flight, " requests in flight, grace period ",
          absl::ToDoubleSeconds(grace), " s");
  const absl::Time deadline = absl::Now() + grace;
  while (!impl.core.AwaitNoCalls(std::min(absl::Milliseconds(100), deadline - absl::Now()))) {
    if (absl::Now() >= deadline || (hurry && hurry())) break;
  }
  if (const int remaining = impl.core.NumCalls(); remaining > 0) {
    LogWarning("aborting ", remaining, " requests still in flight");
    impl.core.AbortAllForDrain();
    // Their streams end within a step or two; a client that reads nothing is cut off below.
    impl.core.AwaitNoCalls(absl::Seconds(5));
  }
  impl.core.SetState(ServerState::kStopped);
  impl.health.Shutdown();
  // HTTP connections (idle keep-alive ones included) close; the io threads end. The engine stops
  // before the HTTP server is destroyed (with Impl): its output listeners post to the server's
  // executors until then.
  if (impl.http != nullptr) impl.http->Stop();
  impl.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  impl.server->Wait();
  if (ServingModel* model = impl.core.model_or_null(); model != nullptr) model->Shutdown();
  LogInfo("stopped");
}

}  // namespace lmserve::server
