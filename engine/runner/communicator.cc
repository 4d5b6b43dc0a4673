#include "engine/runner/communicator.h"

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstring>

#include "common/strings.h"

namespace lmserve::engine {
namespace {

// What the ranks of one group share: a barrier and each rank's buffer of the current call.
struct ThreadGroup {
  explicit ThreadGroup(int32_t size)
      : barrier(size), send(static_cast<size_t>(size)) {}
  bool Barrier(bool ok) {
    if (!ok) failed.store(true);
    barrier.arrive_and_wait();
    return !failed.load();
  }
  std::barrier<> barrier;
  std::atomic<bool> failed{false};
  std::vector<const float*> send;
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int32_t rank, int32_t size)
      : group_(std::move(group)), rank_(rank), size_(size) {}

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }

  absl::Status AllReduceSum(void* data, int64_t count, kernels::DType dtype, void*) override {
    if (dtype != kernels::DType::kF32) {
      return absl::UnimplementedError("CPU all-reduce: float32 only");
    }
    float* values = static_cast<float*>(data);
    group_->send[static_cast<size_t>(rank_)] = values;
    group_->barrier.arrive_and_wait();  // every rank's buffer is posted
    sum_.assign(static_cast<size_t>(count), 0.0f);
    for (const float* other : group_->send) {  // rank order: the same sum on every rank
      for (int64_t i = 0; i < count; ++i) sum_[static_cast<size_t>(i)] += other[i];
    }
    group_->barrier.arrive_and_wait();  // every rank has read every buffer
    std::copy(sum_.begin(), sum_.end(), values);
    return absl::OkStatus();
  }

  bool HostBarrier(bool ok) override { return group_->Barrier(ok); }

  absl::Status AllGather(const void* send, void* recv, int64_t count, kernels::DType dtype,
                         void*) override {
    if (dtype != kernels::DType::kF32) {
      return absl::UnimplementedError("CPU all-gather: float32 only");
    }
    group_->send[static_cast<size_t>(rank_)] = static_cast<const float*>(send);
    group_->barrier.arrive_and_wait();
    float* out = static_cast<float*>(recv);
    for (int32_t r = 0; r < size_; ++r) {
      std::memcpy(out + r * count, group_->send[static_cast<size_t>(r)],
                  static_cast<size_t>(count) * sizeof(float));
    }
    group_->barrier.arrive_and_wait();
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<ThreadGroup> group_;
  const int32_t rank_;
  const int32_t size_;
  std::vector<float> sum_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> CreateThreadCommunicators(int32_t size) {
  auto group = std::make_shared<ThreadGroup>(size);
  std::vector<std::unique_ptr<Communicator>> ranks;
  for (int32_t r = 0; r < size; ++r) {
    ranks.push_back(std::make_unique<ThreadCommunicator>(group, r, size));
  }
  return ranks;
}

}  // namespace lmserve::engine
