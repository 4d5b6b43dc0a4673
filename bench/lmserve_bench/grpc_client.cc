// The lmserve gRPC transport: CompleteStream calls on gRPC's callback API, one reactor per request.
// Each streamed message carries the token ids generated since the previous one, so tokens are
// counted exactly.

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "bench/lmserve_bench/client.h"
#include "common/strings.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "lmserve/v1/lmserve.grpc.pb.h"
#include "server/grpc_status.h"

namespace lmserve::bench {
namespace {

namespace v1 = ::lmserve::v1;

std::string StatusText(const grpc::Status& status) {
  return StrCat("gRPC ", server::GrpcCodeName(status.error_code()), ": ", status.error_message());
}

// One CompleteStream call. It never deletes itself: the client frees it, on the issuing thread,
// once released() says OnDone has run to its end, so CancelAll (on that same thread) never races
// its end.
class StreamCall : public grpc::ClientReadReactor<v1::CompleteStreamResponse> {
 public:
  StreamCall(v1::CompleteRequest request, std::function<void(RequestRecord)> done)
      : request_(std::move(request)), done_(std::move(done)) {}

  void Begin(v1::Lmserve::Stub* stub, const ClientOptions& options, const Prompt& prompt) {
    if (!options.token.empty())
      context_.AddMetadata("authorization", StrCat("Bearer ", options.token));
    if (options.request_timeout_seconds > 0) {
      context_.set_deadline(
          std::chrono::system_clock::now() +
          std::chrono::microseconds(static_cast<int64_t>(options.request_timeout_seconds * 1e6)));
    }
    record_.prompt_tokens = prompt.input_tokens;
    record_.expected_output_tokens = prompt.output_tokens;
    record_.send_time = NowSeconds();
    stub->async()->CompleteStream(&context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    const double now = NowSeconds();
    AddChunk(&record_, now, response_.token_ids_size());
    if (response_.finish_reason() == v1::FINISH_REASON_ABORT ||
        response_.finish_reason() == v1::FINISH_REASON_ERROR) {
      failed_finish_ = true;
    }
    if (response_.has_usage() && response_.usage().prompt_tokens() > 0) {
      record_.prompt_tokens = response_.usage().prompt_tokens();
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    record_.end_time = NowSeconds();
    if (cancelled_.load()) {
      record_.error = kCancelledByClient;
    } else if (!status.ok()) {
      record_.error = StatusText(status);
    } else if (failed_finish_) {
      record_.error = "a choice finished with ABORT or ERROR";
    } else if (record_.output_tokens == 0) {
      record_.error = "the stream ended without a token";
    } else {
      record_.success = true;
    }
    finished_.store(true);
    std::function<void(RequestRecord)> done = std::move(done_);
    done(std::move(record_));
    released_.store(true);  // the last touch of this object
  }

  bool released() const { return released_.load(); }

  void Cancel() {
    if (finished_.load()) return;
    cancelled_.store(true);
    context_.TryCancel();
  }

 private:
  grpc::ClientContext context_;
  v1::CompleteRequest request_;
  v1::CompleteStreamResponse response_;
  std::function<void(RequestRecord)> done_;
  RequestRecord record_;
  bool failed_finish_ = false;
  std::atomic<bool> finished_{false};
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> released_{false};
};

class GrpcClient : public Client {
 public:
  explicit GrpcClient(const ClientOptions& options) : options_(options) {
    for (int32_t i = 0; i < std::max(1, options.num_channels); ++i) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(-1);
      // Distinct arguments and a local subchannel pool: each channel gets its own connection
      // rather than sharing one HTTP/2 connection.
      args.SetInt("lmserve_bench.channel_index", i);
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      channels_.push_back(
          grpc::CreateCustomChannel(options.target, grpc::InsecureChannelCredentials(), args));
      stubs_.push_back(v1::Lmserve::NewStub(channels_.back()));
    }
  }

  ~GrpcClient() override {
    // Every call must have ended before its reactor goes: the load generator waits for them all,
    // and this makes sure of it.
    CancelAll();
    for (;;) {
      bool all_released = true;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& call : calls_) all_released = all_released && call->released();
      }
      if (all_released) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  absl::Status WaitReady(double timeout_seconds) override {
    auto stub = grpc::health::v1::Health::NewStub(channels_[0]);
    const double deadline = NowSeconds() + timeout_seconds;
    std::string last = "no answer";
    do {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      grpc::health::v1::HealthCheckRequest request;
      grpc::health::v1::HealthCheckResponse response;
      const grpc::Status status = stub->Check(&context, request, &response);
      if (status.ok() && response.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
        return absl::OkStatus();
      }
      last = status.ok() ? "NOT_SERVING" : StatusText(status);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    } while (NowSeconds() < deadline);
    return absl::UnavailableError(
        StrCat(options_.target, " was not SERVING within ", timeout_seconds, " s (", last, ")"));
  }

  absl::StatusOr<std::string> Model() override { return std::string(); }

  absl::StatusOr<int32_t> VocabSize() override {
    grpc::ClientContext context;
    Prepare(&context);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::ModelInfo info;
    const grpc::Status status = stubs_[0]->GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
    if (!status.ok()) return absl::UnavailableError(StrCat("GetModelInfo: ", StatusText(status)));
    return info.vocab_size();
  }

  void Start(const Prompt& prompt, std::function<void(RequestRecord)> done) override {
    v1::CompleteRequest request;
    if (!prompt.text.empty()) {
      request.set_text(prompt.text);
    } else {
      request.mutable_token_ids()->mutable_ids()->Add(prompt.token_ids.begin(),
                                                      prompt.token_ids.end());
    }
    v1::SamplingParams* sampling = request.mutable_sampling();
    sampling->set_max_tokens(prompt.output_tokens);
    sampling->set_temperature(static_cast<float>(options_.temperature));
    sampling->set_ignore_eos(options_.ignore_eos);
    StreamCall* call = nullptr;
    size_t index = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Free the calls that have ended, so that long runs do not accumulate them.
      std::erase_if(calls_, [](const std::unique_ptr<StreamCall>& c) { return c->released(); });
      calls_.push_back(std::make_unique<StreamCall>(std::move(request), std::move(done)));
      call = calls_.back().get();
      index = next_channel_++ % stubs_.size();
    }
    call->Begin(stubs_[index].get(), options_, prompt);
  }

  void CancelAll() override {
    std::vector<StreamCall*> calls;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& call : calls_) calls.push_back(call.get());
    }
    for (StreamCall* call : calls) call->Cancel();
  }

  TokenCounting token_counting() const override { return TokenCounting::kTokenIds; }

 private:
  void Prepare(grpc::ClientContext* context) const {
    if (!options_.token.empty())
      context->AddMetadata("authorization", StrCat("Bearer ", options_.token));
  }

  ClientOptions options_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  std::vector<std::unique_ptr<v1::Lmserve::Stub>> stubs_;
  std::mutex mu_;
  std::vector<std::unique_ptr<StreamCall>> calls_;  // guarded by mu_
  size_t next_channel_ = 0;                         // guarded by mu_
};

}  // namespace

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string TokenCountingName(TokenCounting counting) {
  switch (counting) {
    case TokenCounting::kTokenIds:
      return "token_ids";
    case TokenCounting::kUsage:
      return "usage";
    case TokenCounting::kChunks:
      return "chunks";
  }
  return "unknown";
}

absl::StatusOr<std::unique_ptr<Client>> CreateGrpcClient(const ClientOptions& options) {
  if (options.target.empty()) return absl::InvalidArgumentError("no gRPC address");
  return std::unique_ptr<Client>(new GrpcClient(options));
}

}  // namespace lmserve::bench
