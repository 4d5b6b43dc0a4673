// lmserve-allreduce-bench: the all-reduce that tensor parallelism runs after every row-parallel
// projection (engine/runner/cuda/nccl_communicator.h), timed on N GPUs of this host.
//
// For each message size (bf16 elements, as the CUDA runner's activations are), each rank's thread
// captures `--iters` all-reduces in one CUDA graph (as the runner's decode graphs hold them) and
// replays it; the time of one all-reduce is the replay's over iters, the slowest rank's, the
// median of 5 replays. Floor for large messages: the bus bandwidth NCCL reports (2 (N - 1) / N x
// bytes over the time) against the link's, --link-gbps (NVLink 4 on an H100 SXM: 450 GB/s a
// direction per GPU, the datasheet's 900 GB/s both ways). Small messages are latency: no floor.
//
// Messages up to --peer-max-bytes (default and cap: kPeerAllReduceMaxBytes, 512 KiB; 0: none)
// take the peer-to-peer kernel (kernels/cuda/allreduce.h), larger ones NCCL, as in the runner.
//
// Usage: lmserve-allreduce-bench [--gpus 2] [--sizes 16384,262144,...] [--iters 50]
//        [--peer-max-bytes N] [--link-gbps 450]

#include <cuda_runtime.h>

#include <algorithm>
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "common/strings.h"
#include "engine/runner/cuda/nccl_communicator.h"
#include "kernels/cuda/allreduce.h"

namespace lmserve {
namespace {

#define BENCH_CHECK(expr)                                                                 \
  do {                                                                                    \
    const cudaError_t e = (expr);                                                         \
    if (e != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s: %s\n", #expr, cudaGetErrorString(e));                     \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

int Run(int gpus, const std::vector<int64_t>& sizes, int iters, double link_gbps,
        int64_t peer_max_bytes) {
  auto comms = engine::cuda::CreateNcclCommunicators(0, gpus, peer_max_bytes);
  if (!comms.ok()) {
    std::fprintf(stderr, "%s\n", comms.status().ToString().c_str());
    return 1;
  }
  std::printf("%d GPUs; peer-to-peer kernel up to %lld bytes, NCCL beyond; one all-reduce of bf16 "
              "elements, captured %d at a time in a CUDA graph; link floor %.0f GB/s a "
              "direction\n\n",
              gpus, static_cast<long long>(peer_max_bytes), iters, link_gbps);
  std::printf("%12s %12s %14s %10s\n", "bytes", "time (us)", "bus GB/s", "of link");
  std::barrier<> barrier(gpus);
  std::vector<std::vector<double>> seconds(static_cast<size_t>(gpus));
  std::vector<std::thread> threads;
  for (int r = 0; r < gpus; ++r) {
    threads.emplace_back([&, r] {
      engine::Communicator& comm = *(*comms)[static_cast<size_t>(r)];
      BENCH_CHECK(cudaSetDevice(r));
      cudaStream_t stream;
      BENCH_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      const int64_t max_bytes = *std::max_element(sizes.begin(), sizes.end());
      void* data = nullptr;
      BENCH_CHECK(cudaMalloc(&data, static_cast<size_t>(max_bytes)));
      BENCH_CHECK(cudaMemset(data, 0, static_cast<size_t>(max_bytes)));
      cudaEvent_t start, stop;
      BENCH_CHECK(cudaEventCreate(&start));
      BENCH_CHECK(cudaEventCreate(&stop));
      for (int64_t bytes : sizes) {
        const int64_t count = bytes / 2;
        auto reduce = [&] {
          const absl::Status s = comm.AllReduceSum(data, count, kernels::DType::kBF16, stream);
          if (!s.ok()) {
            std::fprintf(stderr, "%s\n", s.ToString().c_str());
            std::exit(1);
          }
        };
        reduce();  // warm-up, eager
        BENCH_CHECK(cudaStreamSynchronize(stream));
        cudaGraph_t graph;
        BENCH_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < iters; ++i) reduce();
        BENCH_CHECK(cudaStreamEndCapture(stream, &graph));
        cudaGraphExec_t exec;
        BENCH_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        BENCH_CHECK(cudaGraphLaunch(exec, stream));  // warm-up replay
        BENCH_CHECK(cudaStreamSynchronize(stream));
        std::vector<double> replays;
        for (int k = 0; k < 5; ++k) {
          barrier.arrive_and_wait();
          BENCH_CHECK(cudaEventRecord(start, stream));
          BENCH_CHECK(cudaGraphLaunch(exec, stream));
          BENCH_CHECK(cudaEventRecord(stop, stream));
          BENCH_CHECK(cudaEventSynchronize(stop));
          float ms = 0;
          BENCH_CHECK(cudaEventElapsedTime(&ms, start, stop));
          replays.push_back(ms * 1e-3 / iters);
        }
        std::sort(replays.begin(), replays.end());
        seconds[static_cast<size_t>(r)].push_back(replays[2]);
        BENCH_CHECK(cudaGraphExecDestroy(exec));
        BENCH_CHECK(cudaGraphDestroy(graph));
        barrier.arrive_and_wait();
      }
      BENCH_CHECK(cudaFree(data));
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (size_t i = 0; i < sizes.size(); ++i) {
    double worst = 0;
    for (const auto& rank : seconds) worst = std::max(worst, rank[i]);
    const double bus = 2.0 * (gpus - 1) / gpus * static_cast<double>(sizes[i]) / worst / 1e9;
    std::printf("%12lld %12.2f %14.1f %9.0f%%\n", static_cast<long long>(sizes[i]), worst * 1e6,
                bus, 100.0 * bus / link_gbps);
  }
  return 0;
}

}  // namespace
}  // namespace lmserve

int main(int argc, char** argv) {
  int gpus = 2, iters = 50;
  double link_gbps = 450;
  int64_t peer_max_bytes = lmserve::kernels::cuda::kPeerAllReduceMaxBytes;
  std::vector<int64_t> sizes = {16384,   65536,    262144,   1048576,
                                4194304, 16777216, 67108864, 268435456};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s needs a value\n", arg.c_str());
      return 2;
    }
    const std::string value = argv[++i];
    if (arg == "--gpus") {
      gpus = std::atoi(value.c_str());
    } else if (arg == "--iters") {
      iters = std::atoi(value.c_str());
    } else if (arg == "--peer-max-bytes") {
      peer_max_bytes = std::atoll(value.c_str());
    } else if (arg == "--link-gbps") {
      link_gbps = std::atof(value.c_str());
    } else if (arg == "--sizes") {
      sizes.clear();
      for (std::string_view part : lmserve::StrSplit(value, ',')) {
        sizes.push_back(std::atoll(std::string(part).c_str()));
      }
    } else {
      std::fprintf(stderr,
                   "usage: lmserve-allreduce-bench [--gpus 2] [--sizes 16384,...] [--iters 50] "
                   "[--peer-max-bytes N] [--link-gbps 450]\n");
      return 2;
    }
  }
  if (gpus < 2 || iters < 1 || sizes.empty()) return 2;
  return lmserve::Run(gpus, sizes, iters, link_gbps, peer_max_bytes);
}
