// The engine: continuous batching over a paged KV cache, on a thread of its own.
//
// Thread safety. Every public method is thread-safe. One engine thread owns the EngineCore (runner,
// block manager, scheduler, sampler): nothing inside it is locked. Only two things cross threads:
// the inbox (new requests, aborts, shutdown), which callers fill under mu_ and the engine thread
// drains before each step, and each request's OutputStream, which the engine thread fills and the
// caller reads.
//
//   auto engine = Engine::Create(std::move(runner), config, std::move(text_decoder));
//   auto handle = (*engine)->Submit(request);         // InvalidArgument names a bad field
//   RequestOutput out;
//   while (handle->stream->Next(&out) == OutputStream::NextResult::kOutput) { ... }
//   (*engine)->Abort(handle->id);                      // blocks are freed within one step

#ifndef LMSERVE_ENGINE_CORE_ENGINE_H_
#define LMSERVE_ENGINE_CORE_ENGINE_H_

#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/core/engine_core.h"

namespace lmserve::engine {

struct RequestHandle {
  RequestId id = 0;
  std::shared_ptr<OutputStream> stream;  // shared by the caller and the engine thread
};

class Engine {
 public:
  // Starts the engine thread. `text_decoder` may be null (no text, no stop strings).
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      std::unique_ptr<ModelRunner> runner, const EngineConfig& config,
      std::unique_ptr<TextDecoder> text_decoder = nullptr);

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine();  // Shutdown()

  // Validates and queues a request. InvalidArgument names the offending field; Unavailable after
  // Shutdown. A request that passes can always complete: it fits in the context and the KV pool.
  absl::StatusOr<RequestHandle> Submit(Request request);

  // Ends request `id` (its samples finish as kAborted) and frees its blocks before the next step
  // runs. No-op for unknown or finished requests.
  void Abort(RequestId id);

  // The statistics as of the last step.
  EngineStats Stats() const;

  // Aborts every unfinished request and stops the engine thread. Idempotent.
  void Shutdown();

  const RequestLimits& limits() const { return core_->limits(); }

 private:
  struct Submission {
    RequestId id;
    Request request;
    double arrival_seconds;
    std::shared_ptr<OutputStream> stream;
  };

  Engine(std::unique_ptr<EngineCore> core, const Clock* clock);
  void Loop();
  bool InboxReady() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::unique_ptr<EngineCore> core_;  // the engine thread's, apart from limits()
  const Clock* const clock_;

  mutable absl::Mutex mu_;
  std::vector<Submission> submissions_ ABSL_GUARDED_BY(mu_);
  std::vector<RequestId> aborts_ ABSL_GUARDED_BY(mu_);
  bool shutdown_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool engine_idle_ ABSL_GUARDED_BY(mu_) = true;  // the core has no work
  RequestId next_request_id_ ABSL_GUARDED_BY(mu_) = 1;

  mutable absl::Mutex stats_mu_;
  EngineStats stats_ ABSL_GUARDED_BY(stats_mu_);

  absl::Mutex join_mu_;  // serializes Shutdown
  std::thread thread_;
};

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_CORE_ENGINE_H_
