#include "engine/runner/tensor_parallel_runner.h"

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/strings.h"
#include "engine/model/family.h"
#include "engine/runner/communicator.h"
#include "engine/runner/cpu_runner.h"
#include "engine/runner/cuda_runner.h"
#ifdef LMSERVE_HAVE_CUDA_RUNNER
#include "engine/runner/cuda/nccl_communicator.h"
#endif

namespace lmserve::engine {
namespace {

// Threads for ranks 1 .. n - 1, kept for the runner's lifetime; Run hands each the same task.
class RankThreads {
 public:
  explicit RankThreads(int32_t n) {
    for (int32_t r = 1; r < n; ++r) threads_.emplace_back([this, r] { Loop(r); });
  }
  ~RankThreads() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    start_.notify_all();
    for (std::thread& thread : threads_) thread.join();
  }

  // Runs task(r) for every rank r, rank 0 on the calling thread; returns once all have returned.
  void Run(const std::function<void(int32_t)>& task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      task_ = &task;
      pending_ = static_cast<int32_t>(threads_.size());
      ++generation_;
    }
    start_.notify_all();
    task(0);
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return pending_ == 0; });
    task_ = nullptr;
  }

 private:
  void Loop(int32_t rank) {
    uint64_t seen = 0;
    while (true) {
      const std::function<void(int32_t)>* task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        start_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        task = task_;
      }
      (*task)(rank);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex mu_;
  std::condition_variable start_, done_;
  const std::function<void(int32_t)>* task_ = nullptr;  // guarded by mu_
  uint64_t generation_ = 0;                             // guarded by mu_
  int32_t pending_ = 0;                                 // guarded by mu_
  bool stop_ = false;                                   // guarded by mu_
  std::vector<std::thread> threads_;
};

class TensorParallelRunner final : public ModelRunner {
 public:
  TensorParallelRunner(const ModelConfig& model,
                       std::vector<std::unique_ptr<Communicator>> communicators)
      : config_(model),
        communicators_(std::move(communicators)),
        threads_(static_cast<int32_t>(communicators_.size())),
        runners_(communicators_.size()),
        rank_outputs_(communicators_.size()) {}

  ~TensorParallelRunner() override {
    // Each rank's runner is destroyed on its own thread (a CUDA runner's device is its thread's).
    threads_.Run([this](int32_t r) { runners_[static_cast<size_t>(r)].reset(); });
  }

  // Builds every rank's runner at once (a CUDA runner's start-up runs collectives).
  absl::Status CreateRanks(const Checkpoint& checkpoint, const RunnerConfig& config) {
    const int32_t n = size();
    std::vector<absl::Status> statuses(static_cast<size_t>(n));
    threads_.Run([&](int32_t r) {
      // An exception must not leave a rank thread (it would end the process): an allocation that
      // fails despite the memory plan is this rank's error, as ModelRunner::Create makes it.
      auto create = [&]() -> absl::Status {
        LMSERVE_ASSIGN_OR_RETURN(ModelConfig shard, ShardModelConfig(config_, n, r));
        LMSERVE_ASSIGN_OR_RETURN(std::unique_ptr<ModelDescription> model, DescribeModel(shard));
        RunnerConfig rank = config;
        rank.communicator = communicators_[static_cast<size_t>(r)].get();
        absl::StatusOr<std::unique_ptr<ModelRunner>> runner;
        if (config.backend == Backend::kCuda) {
#ifdef LMSERVE_HAVE_CUDA_RUNNER
          rank.device = config.device + r;
          runner = CreateCudaRunner(std::move(model), checkpoint, rank);
#else
          runner = absl::UnimplementedError("this lmserve was built without CUDA");
#endif
        } else {
          rank.kv_cache_bytes = config.kv_cache_bytes / n;
          rank.num_threads = std::max(1, config.num_threads / n);
          runner = CreateCpuRunner(std::move(model), checkpoint, rank);
        }
        if (!runner.ok()) {
          return absl::Status(runner.status().code(),
                              StrCat("tensor-parallel rank ", r, " of ", n, ": ",
                                     runner.status().message()));
        }
        runners_[static_cast<size_t>(r)] = *std::move(runner);
        return absl::OkStatus();
      };
      try {
        statuses[static_cast<size_t>(r)] = create();
      } catch (const std::bad_alloc&) {
        statuses[static_cast<size_t>(r)] = absl::ResourceExhaustedError(
            StrCat("tensor-parallel rank ", r, " of ", n, ": out of host memory while loading"));
      }
    });
    for (const absl::Status& status : statuses) LMSERVE_RETURN_IF_ERROR(status);
    return absl::OkStatus();
  }

  const ModelConfig& model_config() const override { return config_; }
  Backend backend() const override { return runners_[0]->backend(); }
  int32_t block_size_tokens() const override { return runners_[0]->block_size_tokens(); }
  int32_t num_kv_blocks() const override {
    int32_t blocks = runners_[0]->num_kv_blocks();
    for (const auto& runner : runners_) blocks = std::min(blocks, runner->num_kv_blocks());
    return blocks;
  }
  std::vector<int32_t> kv_group_windows() const override {
    return runners_[0]->kv_group_windows();
  }
  bool samples_on_device() const override { return runners_[0]->samples_on_device(); }

  RunnerStats stats() const override {
    RunnerStats total = runners_[0]->stats();
    total.weight_bytes = total.kv_cache_bytes = total.workspace_bytes = 0;
    for (const auto& runner : runners_) {
      const RunnerStats s = runner->stats();
      total.weight_bytes += s.weight_bytes;
      total.kv_cache_bytes += s.kv_cache_bytes;
      total.workspace_bytes += s.workspace_bytes;
    }
    total.device_name = StrCat(size(), " x ", total.device_name);
    return total;
  }

  absl::Status Execute(const StepBatch& batch, StepOutput* output) override {
    std::vector<absl::Status> statuses(runners_.size());
    threads_.Run([&](int32_t r) {
      const size_t i = static_cast<size_t>(r);
      statuses[i] = runners_[i]->Execute(batch, r == 0 ? output : &rank_outputs_[i]);
    });
    for (const absl::Status& status : statuses) LMSERVE_RETURN_IF_ERROR(status);
    return absl::OkStatus();
  }

 private:
  int32_t size() const { return static_cast<int32_t>(communicators_.size()); }

  const ModelConfig config_;
  std::vector<std::unique_ptr<Communicator>> communicators_;
  RankThreads threads_;
  std::vector<std::unique_ptr<ModelRunner>> runners_;  // by rank
  std::vector<StepOutput> rank_outputs_;               // ranks 1..: outputs nobody reads
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateTensorParallelRunner(
    const ModelConfig& model, const Checkpoint& checkpoint, const RunnerConfig& config) {
  const int32_t n = config.tensor_parallel_size;
  if (n < 2 || n > 64) {
    return absl::InvalidArgumentError(
        StrCat("--tensor-parallel-size ", n, " is out of range (2 to 64 ranks)"));
  }
  // Every rank's share must exist before any runner starts (clear errors first).
  LMSERVE_RETURN_IF_ERROR(ShardModelConfig(model, n, 0).status());
  std::vector<std::unique_ptr<Communicator>> communicators;
  if (config.backend == Backend::kCuda) {
#ifdef LMSERVE_HAVE_CUDA_RUNNER
    // NCCL only: the peer-to-peer kernel's buffers need peer access enabled between the GPUs,
    // which maps every allocation into every peer, and an allocation (cuBLAS autotuning, a graph's
    // instantiation) may then wait for all of them to idle while a collective waits for this
    // rank: a hang seen on two H100s. It serves lmserve-allreduce-bench until its buffers are
    // mapped to the peers alone (cuMemCreate / cuMemSetAccess).
    LMSERVE_ASSIGN_OR_RETURN(communicators, cuda::CreateNcclCommunicators(config.device, n,
                                                                          /*peer_max_bytes=*/0));
#else
    return absl::UnimplementedError("this lmserve was built without CUDA: use the CPU backend");
#endif
  } else {
    communicators = CreateThreadCommunicators(n);
  }
  auto runner = std::make_unique<TensorParallelRunner>(model, std::move(communicators));
  LMSERVE_RETURN_IF_ERROR(runner->CreateRanks(checkpoint, config));
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

}  // namespace lmserve::engine
