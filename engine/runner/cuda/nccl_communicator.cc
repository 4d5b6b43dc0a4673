#include "engine/runner/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstdlib>
#include <mutex>
#include <string>

#include "common/status.h"
#include "common/strings.h"
#include "kernels/cuda/allreduce.h"

namespace lmserve::engine::cuda {
namespace {

// NCCL's C ABI (nccl.h, NCCL 2.x): the types and entry points this file calls.
using NcclComm = void*;
using NcclResult = int;  // ncclSuccess = 0
enum NcclDataType : int { kNcclFloat16 = 6, kNcclFloat32 = 7, kNcclBfloat16 = 9 };
enum NcclRedOp : int { kNcclSum = 0 };

struct NcclApi {
  NcclResult (*get_version)(int*) = nullptr;
  const char* (*get_error_string)(NcclResult) = nullptr;
  NcclResult (*comm_init_all)(NcclComm*, int, const int*) = nullptr;
  NcclResult (*comm_destroy)(NcclComm) = nullptr;
  NcclResult (*all_reduce)(const void*, void*, size_t, NcclDataType, NcclRedOp, NcclComm,
                           cudaStream_t) = nullptr;
  NcclResult (*all_gather)(const void*, void*, size_t, NcclDataType, NcclComm,
                           cudaStream_t) = nullptr;
  int version = 0;
};

// Loads NCCL once for the process; the error says where it looked.
absl::StatusOr<const NcclApi*> LoadNccl() {
  static std::once_flag once;
  static NcclApi api;
  static absl::Status status;
  std::call_once(once, [] {
    const char* override_path = std::getenv("LMSERVE_NCCL_LIBRARY");
    const std::string path = override_path != nullptr ? override_path : "libnccl.so.2";
    void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* error = dlerror();
      status = absl::FailedPreconditionError(StrCat(
          "tensor parallelism needs NCCL: cannot load ", path, " (",
          error != nullptr ? error : "unknown error",
          "); install it (pip install nvidia-nccl-cu13) and put its nvidia/nccl/lib in "
          "LD_LIBRARY_PATH, or set LMSERVE_NCCL_LIBRARY to the library's path"));
      return;
    }
    auto bind = [&](auto** fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(library, name));
      if (*fn == nullptr && status.ok()) {
        status = absl::FailedPreconditionError(StrCat(path, " has no ", name));
      }
    };
    bind(&api.get_version, "ncclGetVersion");
    bind(&api.get_error_string, "ncclGetErrorString");
    bind(&api.comm_init_all, "ncclCommInitAll");
    bind(&api.comm_destroy, "ncclCommDestroy");
    bind(&api.all_reduce, "ncclAllReduce");
    bind(&api.all_gather, "ncclAllGather");
    if (status.ok()) api.get_version(&api.version);
  });
  if (!status.ok()) return status;
  return &api;
}

absl::StatusOr<NcclDataType> ToNccl(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kF32:
      return kNcclFloat32;
    case kernels::DType::kBF16:
      return kNcclBfloat16;
    case kernels::DType::kF16:
      return kNcclFloat16;
    default:
      return absl::InvalidArgumentError(
          StrCat("NCCL collective of ", kernels::DTypeName(dtype), " elements"));
  }
}

namespace kc = kernels::cuda;

// One rank's buffers of the peer-to-peer all-reduce (kernels/cuda/allreduce.h), on its device.
struct PeerBuffers {
  void* staging = nullptr;
  uint64_t* flags = nullptr;
  uint64_t* counters = nullptr;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclApi* api, NcclComm comm, int32_t rank, int32_t size, int32_t device,
                   int64_t peer_max_bytes, std::vector<PeerBuffers> peers,
                   std::shared_ptr<std::barrier<>> barrier,
                   std::shared_ptr<std::atomic<bool>> failed)
      : barrier_(std::move(barrier)),
        failed_(std::move(failed)),
        api_(api),
        comm_(comm),
        rank_(rank),
        size_(size),
        device_(device),
        peer_max_bytes_(peer_max_bytes),
        peers_(std::move(peers)) {
    peer_.rank = rank;
    peer_.size = size;
    for (size_t r = 0; r < peers_.size(); ++r) {
      peer_.staging[r] = peers_[r].staging;
      peer_.flags[r] = peers_[r].flags;
    }
    if (!peers_.empty()) peer_.counters = peers_[static_cast<size_t>(rank)].counters;
  }
  ~NcclCommunicator() override {
    api_->comm_destroy(comm_);
    if (!peers_.empty()) {  // this rank's own buffers
      cudaSetDevice(device_);
      const PeerBuffers& mine = peers_[static_cast<size_t>(rank_)];
      cudaFree(mine.staging);
      cudaFree(mine.flags);
      cudaFree(mine.counters);
      int num_devices = 0;
      cudaGetDeviceCount(&num_devices);
      for (int other = 0; other < num_devices; ++other) {
        if (other != device_) cudaDeviceDisablePeerAccess(other);
      }
      cudaGetLastError();
    }
  }

  int32_t rank() const override { return rank_; }
  int32_t size() const override { return size_; }

  absl::Status AllReduceSum(void* data, int64_t count, kernels::DType dtype,
                            void* stream) override {
    const int64_t bytes = count * kernels::RowBytes(dtype, 1);
    if (!peers_.empty() && bytes <= peer_max_bytes_ && bytes % 16 == 0) {
      kc::PeerAllReduceParams params = peer_;
      params.data = data;
      params.count = count;
      params.dtype = dtype;
      if (const cudaError_t e = kc::Launch(params, static_cast<cudaStream_t>(stream));
          e != cudaSuccess) {
        return absl::InternalError(
            StrCat("peer all-reduce on rank ", rank_, ": ", cudaGetErrorString(e)));
      }
      return absl::OkStatus();
    }
    const absl::StatusOr<NcclDataType> type = ToNccl(dtype);
    if (!type.ok()) return type.status();
    return Check(api_->all_reduce(data, data, static_cast<size_t>(count), *type, kNcclSum, comm_,
                                  static_cast<cudaStream_t>(stream)),
                 "ncclAllReduce");
  }

  bool HostBarrier(bool ok) override {
    if (!ok) failed_->store(true);
    barrier_->arrive_and_wait();
    return !failed_->load();
  }

  absl::Status AllGather(const void* send, void* recv, int64_t count, kernels::DType dtype,
                         void* stream) override {
    const absl::StatusOr<NcclDataType> type = ToNccl(dtype);
    if (!type.ok()) return type.status();
    return Check(api_->all_gather(send, recv, static_cast<size_t>(count), *type, comm_,
                                  static_cast<cudaStream_t>(stream)),
                 "ncclAllGather");
  }

 private:
  absl::Status Check(NcclResult result, const char* what) const {
    if (result == 0) return absl::OkStatus();
    return absl::InternalError(StrCat(what, " on rank ", rank_, ": ",
                                      api_->get_error_string(result)));
  }

  const std::shared_ptr<std::barrier<>> barrier_;  // the ranks' threads
  const std::shared_ptr<std::atomic<bool>> failed_;  // a rank passed !ok to HostBarrier
  const NcclApi* api_;
  NcclComm comm_;
  const int32_t rank_;
  const int32_t size_;
  const int32_t device_;
  const int64_t peer_max_bytes_;
  const std::vector<PeerBuffers> peers_;  // by rank; empty without peer access
  kc::PeerAllReduceParams peer_;          // every field but the message's
};

// Peer access between every pair of the devices, and each rank's buffers of the peer all-reduce;
// nothing (an empty vector) where a pair cannot reach each other or there are too many ranks.
absl::StatusOr<std::vector<PeerBuffers>> SetUpPeers(const std::vector<int>& devices) {
  const int n = static_cast<int>(devices.size());
  if (n > kc::kPeerAllReduceMaxRanks) return std::vector<PeerBuffers>{};
  for (int a : devices) {
    for (int b : devices) {
      int can = 0;
      if (a != b && (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || can == 0)) {
        cudaGetLastError();
        return std::vector<PeerBuffers>{};
      }
    }
  }
  std::vector<PeerBuffers> peers(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const int device = devices[static_cast<size_t>(r)];
    auto check = [&](cudaError_t e, const char* what) -> absl::Status {
      if (e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();
        return absl::OkStatus();
      }
      return absl::InternalError(StrCat("GPU ", device, ": ", what, ": ", cudaGetErrorString(e)));
    };
    LMSERVE_RETURN_IF_ERROR(check(cudaSetDevice(device), "cudaSetDevice"));
    for (int other : devices) {
      if (other != device) {
        LMSERVE_RETURN_IF_ERROR(check(cudaDeviceEnablePeerAccess(other, 0), "peer access"));
      }
    }
    PeerBuffers& mine = peers[static_cast<size_t>(r)];
    LMSERVE_RETURN_IF_ERROR(
        check(cudaMalloc(&mine.staging, kc::kPeerAllReduceStagingBytes), "cudaMalloc"));
    LMSERVE_RETURN_IF_ERROR(check(cudaMalloc(reinterpret_cast<void**>(&mine.flags),
                                             kc::kPeerAllReduceFlagBytes),
                                  "cudaMalloc"));
    LMSERVE_RETURN_IF_ERROR(check(cudaMalloc(reinterpret_cast<void**>(&mine.counters),
                                             kc::kPeerAllReduceCounterBytes),
                                  "cudaMalloc"));
    LMSERVE_RETURN_IF_ERROR(
        check(cudaMemset(mine.flags, 0, kc::kPeerAllReduceFlagBytes), "cudaMemset"));
    LMSERVE_RETURN_IF_ERROR(
        check(cudaMemset(mine.counters, 0, kc::kPeerAllReduceCounterBytes), "cudaMemset"));
  }
  for (int device : devices) {
    cudaSetDevice(device);
    LMSERVE_RETURN_IF_ERROR(
        cudaDeviceSynchronize() == cudaSuccess
            ? absl::OkStatus()
            : absl::InternalError(StrCat("GPU ", device, ": setting up the peer all-reduce")));
  }
  return peers;
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateNcclCommunicators(
    int32_t first_device, int32_t size, int64_t peer_max_bytes) {
  int num_devices = 0;
  if (cudaGetDeviceCount(&num_devices) != cudaSuccess) {
    cudaGetLastError();
    num_devices = 0;
  }
  if (first_device < 0 || first_device + size > num_devices) {
    return absl::FailedPreconditionError(
        StrCat("--tensor-parallel-size ", size, " needs CUDA devices ", first_device, " to ",
               first_device + size - 1, "; this machine has ", num_devices));
  }
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);  // no NVLink multicast objects
  // Connections made at initialization, not at a collective's first call: NCCL then allocates
  // nothing while the runners' first collectives run (an allocation may wait for every GPU).
  setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
  const absl::StatusOr<const NcclApi*> api = LoadNccl();
  if (!api.ok()) return api.status();
  std::vector<int> devices(static_cast<size_t>(size));
  for (int32_t r = 0; r < size; ++r) devices[static_cast<size_t>(r)] = first_device + r;
  std::vector<NcclComm> comms(static_cast<size_t>(size), nullptr);
  if (const NcclResult result = (*api)->comm_init_all(comms.data(), size, devices.data());
      result != 0) {
    return absl::InternalError(
        StrCat("ncclCommInitAll over ", size, " GPUs: ", (*api)->get_error_string(result)));
  }
  std::vector<PeerBuffers> peers;
  if (peer_max_bytes > 0) {
    absl::StatusOr<std::vector<PeerBuffers>> set_up = SetUpPeers(devices);
    if (!set_up.ok()) return set_up.status();
    peers = *std::move(set_up);
  }
  auto barrier = std::make_shared<std::barrier<>>(size);
  auto failed = std::make_shared<std::atomic<bool>>(false);
  std::vector<std::unique_ptr<Communicator>> ranks;
  for (int32_t r = 0; r < size; ++r) {
    ranks.push_back(std::make_unique<NcclCommunicator>(
        *api, comms[static_cast<size_t>(r)], r, size, first_device + r,
        std::min(peer_max_bytes, kc::kPeerAllReduceMaxBytes), peers, barrier, failed));
  }
  return ranks;
}

}  // namespace lmserve::engine::cuda
