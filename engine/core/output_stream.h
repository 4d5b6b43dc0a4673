// A request's output channel: the engine thread pushes, any one caller thread reads.

#ifndef LMSERVE_ENGINE_CORE_OUTPUT_STREAM_H_
#define LMSERVE_ENGINE_CORE_OUTPUT_STREAM_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/core/request.h"

namespace lmserve::engine {

class OutputStream {
 public:
  OutputStream(RequestId request_id, int32_t num_samples);

  OutputStream(const OutputStream&) = delete;
  OutputStream& operator=(const OutputStream&) = delete;

  RequestId request_id() const { return request_id_; }

  enum class NextResult {
    kOutput,   // *out holds the next output
    kTimeout,  // nothing arrived within the timeout
    kEnded,    // every sample has finished and every output has been read
  };
  // Waits up to `timeout` (zero: a poll) for the next output. Thread-safe.
  NextResult Next(RequestOutput* out, absl::Duration timeout = absl::InfiniteDuration());

  // Takes every output available now, without waiting. Thread-safe.
  std::vector<RequestOutput> TakeAvailable();

  // True once every sample's final output has been pushed (some may still be unread).
  bool finished() const;

  // Engine side: appends an output; the stream finishes with the last sample's final output.
  void Push(RequestOutput output);

  // Registers `listener`, called after every Push (on the engine thread, no lock held), and once at
  // once when outputs are already waiting, so that an asynchronous reader (a gRPC reactor) needs no
  // thread blocked in Next. The listener must be quick and must not block: it should only hand the
  // work to the reader's own thread. Replaces any previous listener.
  void SetListener(std::function<void()> listener);

 private:
  const RequestId request_id_;
  mutable absl::Mutex mu_;
  std::deque<RequestOutput> queue_ ABSL_GUARDED_BY(mu_);
  int32_t num_unfinished_samples_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const std::function<void()>> listener_ ABSL_GUARDED_BY(mu_);
};

// Pushes outputs into their streams on a thread of its own, so that the engine's thread does not
// spend its time between steps waking the streams' readers (a push runs the stream's listener,
// which posts to a front end's thread). One queue and one thread: outputs reach their streams in
// the order they were added, so each stream keeps its order. The engine adds a step's outputs as
// it computes them and flushes them in batches.
class OutputEmitter {
 public:
  OutputEmitter();
  OutputEmitter(const OutputEmitter&) = delete;
  OutputEmitter& operator=(const OutputEmitter&) = delete;
  // Pushes everything added, then stops the thread.
  ~OutputEmitter();

  // The adding thread's side (one thread): queues `output` for `stream`; every kBatch outputs,
  // and at Flush, the queued ones go to the emitting thread.
  void Add(std::shared_ptr<OutputStream> stream, RequestOutput output);
  void Flush();

 private:
  static constexpr size_t kBatch = 256;
  struct Item {
    std::shared_ptr<OutputStream> stream;
    RequestOutput output;
  };
  void Loop();

  std::vector<Item> pending_;  // the adding thread's, not yet handed over
  absl::Mutex mu_;
  std::vector<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts after the fields above
};

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_CORE_OUTPUT_STREAM_H_
