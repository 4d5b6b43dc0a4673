#include "engine/core/engine.h"

#include <utility>

namespace lmserve::engine {

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<ModelRunner> runner,
                                                       const EngineConfig& config,
                                                       std::unique_ptr<TextDecoder> text_decoder) {
  auto core = EngineCore::Create(std::move(runner), config, std::move(text_decoder));
  if (!core.ok()) return core.status();
  const Clock* clock = config.clock != nullptr ? config.clock : SystemClock::Get();
  return std::unique_ptr<Engine>(new Engine(*std::move(core), clock));
}

Engine::Engine(std::unique_ptr<EngineCore> core, const Clock* clock)
    : core_(std::move(core)), clock_(clock) {
  thread_ = std::thread([this] { Loop(); });
}

Engine::~Engine() { Shutdown(); }

absl::StatusOr<RequestHandle> Engine::Submit(Request request) {
  if (absl::Status status = core_->Validate(request); !status.ok()) return status;
  const double arrival_seconds = clock_->NowSeconds();
  absl::MutexLock lock(&mu_);
  if (shutdown_requested_) return absl::UnavailableError("the engine is shut down");
  RequestHandle handle;
  handle.id = next_request_id_++;
  handle.stream = std::make_shared<OutputStream>(handle.id, request.sampling.n);
  submissions_.push_back({handle.id, std::move(request), arrival_seconds, handle.stream});
  return handle;
}

void Engine::Abort(RequestId id) {
  absl::MutexLock lock(&mu_);
  if (!shutdown_requested_) aborts_.push_back(id);
}

EngineStats Engine::Stats() const {
  absl::MutexLock lock(&stats_mu_);
  return stats_;
}

void Engine::Shutdown() {
  absl::MutexLock join_lock(&join_mu_);
  {
    absl::MutexLock lock(&mu_);
    shutdown_requested_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool Engine::InboxReady() const {
  return !submissions_.empty() || !aborts_.empty() || shutdown_requested_ || !engine_idle_;
}

void Engine::Loop() {
  std::vector<Submission> submissions;
  std::vector<RequestId> aborts;
  while (true) {
    bool shutdown;
    {
      absl::MutexLock lock(&mu_);
      engine_idle_ = !core_->HasWork();
      mu_.Await(absl::Condition(this, &Engine::InboxReady));
      submissions.swap(submissions_);
      aborts.swap(aborts_);
      shutdown = shutdown_requested_;
    }
    for (Submission& submission : submissions) {
      core_->AddRequest(submission.id, std::move(submission.request), submission.arrival_seconds,
                        std::move(submission.stream));
    }
    submissions.clear();
    for (RequestId id : aborts) core_->Abort(id);
    aborts.clear();
    if (shutdown) {
      core_->AbortAll();
      core_->StopEmitter();  // every output in its stream before Shutdown returns
    } else {
      core_->Step();
    }
    {
      absl::MutexLock lock(&stats_mu_);
      stats_ = core_->Stats();
    }
    if (shutdown) return;
  }
}

}  // namespace lmserve::engine
