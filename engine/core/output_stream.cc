#include "engine/core/output_stream.h"

#include <iterator>
#include <utility>

#include "engine/core/check.h"

namespace lmserve::engine {

OutputStream::OutputStream(RequestId request_id, int32_t num_samples)
    : request_id_(request_id), num_unfinished_samples_(num_samples) {}

OutputStream::NextResult OutputStream::Next(RequestOutput* out, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || num_unfinished_samples_ == 0;
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (!queue_.empty()) {
    *out = std::move(queue_.front());
    queue_.pop_front();
    return NextResult::kOutput;
  }
  return num_unfinished_samples_ == 0 ? NextResult::kEnded : NextResult::kTimeout;
}

std::vector<RequestOutput> OutputStream::TakeAvailable() {
  absl::MutexLock lock(&mu_);
  std::vector<RequestOutput> outputs(std::make_move_iterator(queue_.begin()),
                                     std::make_move_iterator(queue_.end()));
  queue_.clear();
  return outputs;
}

bool OutputStream::finished() const {
  absl::MutexLock lock(&mu_);
  return num_unfinished_samples_ == 0;
}

void OutputStream::Push(RequestOutput output) {
  std::shared_ptr<const std::function<void()>> listener;
  {
    absl::MutexLock lock(&mu_);
    if (output.finished) {
      LMSERVE_CORE_CHECK(num_unfinished_samples_ > 0, "request ", request_id_,
                         ": a final output after every sample finished");
      --num_unfinished_samples_;
    }
    queue_.push_back(std::move(output));
    listener = listener_;
  }
  if (listener != nullptr) (*listener)();
}

void OutputStream::SetListener(std::function<void()> listener) {
  auto shared = std::make_shared<const std::function<void()>>(std::move(listener));
  bool waiting;
  {
    absl::MutexLock lock(&mu_);
    listener_ = shared;
    waiting = !queue_.empty();
  }
  if (waiting) (*shared)();
}

OutputEmitter::OutputEmitter() : thread_([this] { Loop(); }) {}

OutputEmitter::~OutputEmitter() {
  Flush();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void OutputEmitter::Add(std::shared_ptr<OutputStream> stream, RequestOutput output) {
  pending_.push_back({std::move(stream), std::move(output)});
  if (pending_.size() >= kBatch) Flush();
}

void OutputEmitter::Flush() {
  if (pending_.empty()) return;
  absl::MutexLock lock(&mu_);
  if (queue_.empty()) {
    queue_.swap(pending_);
  } else {
    queue_.insert(queue_.end(), std::make_move_iterator(pending_.begin()),
                  std::make_move_iterator(pending_.end()));
    pending_.clear();
  }
}

void OutputEmitter::Loop() {
  std::vector<Item> batch;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](OutputEmitter* emitter) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return emitter->stop_ || !emitter->queue_.empty();
          },
          this));
      if (queue_.empty() && stop_) return;
      batch.swap(queue_);
    }
    for (Item& item : batch) item.stream->Push(std::move(item.output));
    batch.clear();
  }
}

}  // namespace lmserve::engine
