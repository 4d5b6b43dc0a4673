#include "kernels/cuda/allreduce.h"

#include "kernels/cuda/common.cuh"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kThreads = 256;

struct Pointers {
  const unsigned char* staging[kPeerAllReduceMaxRanks];
  uint64_t* flags[kPeerAllReduceMaxRanks];
};

__device__ __forceinline__ void StoreRelease(uint64_t* address, uint64_t value) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(address), "l"(value) : "memory");
}
__device__ __forceinline__ uint64_t LoadAcquire(const uint64_t* address) {
  uint64_t value;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(value) : "l"(address) : "memory");
  return value;
}
__device__ __forceinline__ uint64_t GlobalTimer() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

// Eight elements of T (16 bytes) as fp32, and back.
template <typename T>
__device__ __forceinline__ void AddPiece(uint4 piece, float* acc) {
  if constexpr (std::is_same_v<T, float>) {
    acc[0] += __uint_as_float(piece.x), acc[1] += __uint_as_float(piece.y);
    acc[2] += __uint_as_float(piece.z), acc[3] += __uint_as_float(piece.w);
  } else {
    const uint32_t words[4] = {piece.x, piece.y, piece.z, piece.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = Unpack2<T>(words[j]);
      acc[2 * j] += f.x, acc[2 * j + 1] += f.y;
    }
  }
}
template <typename T>
__device__ __forceinline__ uint4 PackPiece(const float* acc) {
  uint4 out;
  if constexpr (std::is_same_v<T, float>) {
    out = make_uint4(__float_as_uint(acc[0]), __float_as_uint(acc[1]), __float_as_uint(acc[2]),
                     __float_as_uint(acc[3]));
  } else {
    T values[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) values[j] = FromFloat<T>(acc[j]);
    out = *reinterpret_cast<const uint4*>(values);
  }
  return out;
}

// Block b reduces pieces (16-byte vectors) [begin, end) of the message.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    OneShotKernel(uint4* data, int64_t num_pieces, int rank, int size, Pointers p,
                  uint64_t* counters) {
  __shared__ uint64_t call;
  const int64_t per_block = CeilDiv(num_pieces, gridDim.x);
  const int64_t begin = blockIdx.x * per_block;
  const int64_t end = min(num_pieces, begin + per_block);
  if (threadIdx.x == 0) {
    call = counters[blockIdx.x] + 1;
    counters[blockIdx.x] = call;
  }
  __syncthreads();
  const int64_t half = (call & 1) * (kPeerAllReduceMaxBytes / 16);
  // This rank's range into its staging half.
  uint4* mine = reinterpret_cast<uint4*>(const_cast<unsigned char*>(p.staging[rank])) + half;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) mine[i] = data[i];
  __syncthreads();
  // Signal this block of every rank (release: the copy above is visible first), then wait for
  // theirs.
  if (threadIdx.x < size) {
    StoreRelease(p.flags[threadIdx.x] + blockIdx.x * kPeerAllReduceMaxRanks + rank, call);
    const uint64_t* flag = p.flags[rank] + blockIdx.x * kPeerAllReduceMaxRanks + threadIdx.x;
    const uint64_t start = GlobalTimer();
    while (LoadAcquire(flag) < call) {
      if (GlobalTimer() - start > kPeerAllReduceTimeoutNs) __trap();
    }
  }
  __syncthreads();
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
    float acc[8] = {};
    for (int r = 0; r < size; ++r) {  // rank order: the same sum on every rank
      const uint4* theirs = reinterpret_cast<const uint4*>(p.staging[r]) + half;
      AddPiece<T>(__ldcv(theirs + i), acc);
    }
    data[i] = PackPiece<T>(acc);
  }
}

}  // namespace

cudaError_t Launch(const PeerAllReduceParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  const int64_t num_pieces = p.count * (p.dtype == DType::kF32 ? 4 : 2) / 16;
  if (num_pieces == 0) return cudaSuccess;
  // Always every block, whatever the size (the empty ones only signal and wait): each block's
  // call counter then counts every call, so all blocks agree on the staging half, and a call
  // starts only once every block of the peers' previous calls has (allreduce.h).
  const int blocks = kPeerAllReduceMaxBlocks;
  Pointers pointers{};
  for (int r = 0; r < p.size; ++r) {
    pointers.staging[r] = static_cast<const unsigned char*>(p.staging[r]);
    pointers.flags[r] = p.flags[r];
  }
  uint4* data = static_cast<uint4*>(p.data);
  switch (p.dtype) {
    case DType::kF32:
      OneShotKernel<float><<<blocks, kThreads, 0, stream>>>(data, num_pieces, p.rank, p.size,
                                                            pointers, p.counters);
      break;
    case DType::kBF16:
      OneShotKernel<__nv_bfloat16><<<blocks, kThreads, 0, stream>>>(data, num_pieces, p.rank,
                                                                    p.size, pointers, p.counters);
      break;
    default:
      OneShotKernel<__half><<<blocks, kThreads, 0, stream>>>(data, num_pieces, p.rank, p.size,
                                                             pointers, p.counters);
      break;
  }
  return cudaGetLastError();
}

}  // namespace lmserve::kernels::cuda
