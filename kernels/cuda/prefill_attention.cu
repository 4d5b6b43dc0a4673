#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/fp8_cache.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/prefill_attention_sm90.h"
#include "kernels/cuda/prefill_tiles.cuh"

namespace lmserve::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kPlanThreads = 1024;

struct PrefillArgs {
  const void* query;
  const void* key_cache;
  const void* value_cache;
  const int32_t* query_start;
  const int32_t* context_lens;
  const int32_t* block_table_start;
  const int32_t* block_table_ids;
  const int32_t* tile_start;  // [num_seqs + 1]: the plan
  void* output;
  int num_seqs, group_size, num_kv_heads, num_heads, block_size;
  int window;  // 0: none
  int64_t query_stride;
  // Scores in the log2 domain: q.k * score_scale (scale * log2(e)) without a soft-cap, else
  // cap_log2 * tanh(q.k * score_scale) (scale / softcap, softcap * log2(e)).
  float score_scale;
  float cap_log2;  // 0: no soft-cap
  float out_scale;  // the FP8 cache's value scale (kF8 only)
};

template <int kHeadDim>
struct PrefillShape {
  // Each warp owns kMTiles x 16 query rows: two m-tiles share every K and V fragment read from
  // shared memory (half the shared-memory traffic per FLOP); head dim 256 keeps one for registers.
  static constexpr int kMTiles = kHeadDim <= 128 ? 2 : 1;
  static constexpr int kBlockM = kWarps * 16 * kMTiles;
  static_assert(kBlockM == PrefillBlockRows(kHeadDim), "the plan and the kernel agree");
  // Keys per tile: 64 where the registers allow (no spills), else 32.
  static constexpr int kBlockN = kHeadDim <= 64 ? 64 : 32;
  static constexpr int kStride = kHeadDim + 8;  // shared-memory row, padded: ldmatrix conflict-free
  static constexpr int kSmemElements = (kBlockM + 4 * kBlockN) * kStride;  // Q, 2 x (K, V)
  // An FP8 cache: 2 x (K, V) tiles of E4M3 rows (padded to 16-byte multiples) after them.
  static constexpr int kF8Stride = kHeadDim + 16;
  static constexpr int kF8StagingBytes = 4 * kBlockN * kF8Stride;
};

// One block: tile_start[i] = sum over j < i of ceil(query_len_j / kBlockM).
__global__ void __launch_bounds__(kPlanThreads)
    PrefillPlanKernel(const int32_t* __restrict__ query_start, int num_seqs, int block_m,
                      int32_t* __restrict__ tile_start) {
  __shared__ int32_t warp_sums[32];
  __shared__ int32_t carry;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (threadIdx.x == 0) carry = 0;
  __syncthreads();
  for (int base = 0; base < num_seqs; base += kPlanThreads) {
    const int i = base + threadIdx.x;
    int tiles = 0;
    if (i < num_seqs) {
      const int len = query_start[i + 1] - query_start[i];
      tiles = len > 0 ? (len + block_m - 1) / block_m : 0;
    }
    int inclusive = tiles;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, inclusive, offset);
      if (lane >= offset) inclusive += v;
    }
    if (lane == 31) warp_sums[warp] = inclusive;
    __syncthreads();
    if (warp == 0) {
      int w = warp_sums[lane];
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, w, offset);
        if (lane >= offset) w += v;
      }
      warp_sums[lane] = w;  // inclusive over warps
    }
    __syncthreads();
    inclusive += (warp > 0 ? warp_sums[warp - 1] : 0);
    if (i < num_seqs) tile_start[i] = carry + inclusive - tiles;
    __syncthreads();
    if (threadIdx.x == kPlanThreads - 1) carry += inclusive;
    __syncthreads();
  }
  if (threadIdx.x == 0) tile_start[num_seqs] = carry;
}

// grid (ceil(num_tokens / kBlockM) + num_seqs, num_heads): block x takes tile
// gridDim.x - 1 - x of the plan (the last, longest tiles of each sequence start first) or exits.
// kF8: the caches hold E4M3 (fp8_cache.cuh), staged and widened into s_k / s_v.
template <typename T, int kHeadDim, bool kF8>
__global__ void __launch_bounds__(kThreads) PrefillAttentionKernel(PrefillArgs a) {
  using Shape = PrefillShape<kHeadDim>;
  constexpr int kMTiles = Shape::kMTiles;
  constexpr int kBlockM = Shape::kBlockM;
  constexpr int kBlockN = Shape::kBlockN;
  constexpr int kStride = Shape::kStride;
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* s_q = reinterpret_cast<T*>(smem_raw);
  T* s_k = s_q + kBlockM * kStride;       // [2][kBlockN][kStride]
  T* s_v = s_k + 2 * kBlockN * kStride;   // [2][kBlockN][kStride]
  // kF8: [2][K, V][kBlockN][kF8Stride] bytes.
  [[maybe_unused]] uint8_t* s_f8 = reinterpret_cast<uint8_t*>(s_v + 2 * kBlockN * kStride);
  [[maybe_unused]] constexpr int kF8Stride = Shape::kF8Stride;
  [[maybe_unused]] constexpr int kF8Chunks = kHeadDim / 16;  // 16-byte chunks of an E4M3 row

  PrefillTile t;
  if (!LocatePrefillTile(static_cast<int>(gridDim.x - 1 - blockIdx.x), kBlockM, a.num_seqs,
                         a.tile_start, a.query_start, a.context_lens, &t)) {
    return;
  }
  const int seq = t.seq;
  const int head = blockIdx.y;
  const int kv_head = head / a.group_size;
  const int seq_token0 = t.seq_token0;
  const int context_len = t.context_len;
  const int row0 = t.row0;
  const int rows = t.rows;
  const int first_pos = t.first_pos;  // position of row 0
  const int kv_end = min(context_len, first_pos + rows);  // keys [kv_begin, kv_end)
  // With a window, row 0's window starts the keys any row sees; tiles before it are skipped and
  // positions before it never loaded (their table entries may be -1).
  const int kv_begin = PrefillFirstKey(first_pos, a.window);
  const int first_kv_tile = kv_begin / kBlockN;
  const int num_kv_tiles = (kv_end + kBlockN - 1) / kBlockN - first_kv_tile;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const T* q_ptr = static_cast<const T*>(a.query) + int64_t{seq_token0 + row0} * a.query_stride +
                   int64_t{head} * kHeadDim;
  for (int c = tid; c < kBlockM * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool valid = r < rows;
    CpAsync16(s_q + r * kStride + col, valid ? q_ptr + int64_t{r} * a.query_stride + col : q_ptr,
              valid);
  }
  const T* key_cache = static_cast<const T*>(a.key_cache);
  const T* value_cache = static_cast<const T*>(a.value_cache);
  const int32_t* table = a.block_table_ids + a.block_table_start[seq];
  const int64_t token_stride = int64_t{a.num_kv_heads} * kHeadDim;
  // Elements into the cache of position `pos`'s KV head row, from column `col`.
  auto cache_offset = [&](int pos, int col) {
    const int block_index = pos / a.block_size;
    const int64_t slot =
        int64_t{table[block_index]} * a.block_size + (pos - block_index * a.block_size);
    return slot * token_stride + int64_t{kv_head} * kHeadDim + col;
  };
  auto load_kv = [&](int kv_tile, int buffer) {
    const int n0 = kv_tile * kBlockN;
    if constexpr (kF8) {
      const uint8_t* key_bytes = static_cast<const uint8_t*>(a.key_cache);
      const uint8_t* value_bytes = static_cast<const uint8_t*>(a.value_cache);
      uint8_t* dst_k = s_f8 + buffer * 2 * kBlockN * kF8Stride;
      uint8_t* dst_v = dst_k + kBlockN * kF8Stride;
      for (int c = tid; c < kBlockN * kF8Chunks; c += kThreads) {
        const int r = c / kF8Chunks, col = (c % kF8Chunks) * 16;
        const int pos = n0 + r;
        const bool valid = pos >= kv_begin && pos < kv_end;
        const int64_t offset = valid ? cache_offset(pos, col) : 0;
        CpAsync16(dst_k + r * kF8Stride + col, key_bytes + offset, valid);
        CpAsync16(dst_v + r * kF8Stride + col, value_bytes + offset, valid);
      }
      return;
    }
    T* dst_k = s_k + buffer * kBlockN * kStride;
    T* dst_v = s_v + buffer * kBlockN * kStride;
    for (int c = tid; c < kBlockN * kChunks; c += kThreads) {
      const int r = c / kChunks, col = (c % kChunks) * 8;
      const int pos = n0 + r;
      const bool valid = pos >= kv_begin && pos < kv_end;
      const int64_t offset = valid ? cache_offset(pos, col) : 0;
      CpAsync16(dst_k + r * kStride + col, key_cache + offset, valid);
      CpAsync16(dst_v + r * kStride + col, value_cache + offset, valid);
    }
  };
  load_kv(first_kv_tile, 0);
  CpAsyncCommit();

  float o[kMTiles][kHeadDim / 8][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int i = 0; i < kHeadDim / 8; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.0f;
  }
  float m[kMTiles][2], l[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
  const int warp_row0 = warp * 16 * kMTiles;
  const int ldm = lane / 8, ldr = lane % 8;  // ldmatrix: matrix and row of this lane

  for (int j = 0; j < num_kv_tiles; ++j) {
    if (j + 1 < num_kv_tiles) load_kv(first_kv_tile + j + 1, (j + 1) & 1);
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();
    if constexpr (kF8) {
      // Widen the landed E4M3 tiles into the 16-bit ones (zeros, where cp.async filled zeros).
      const uint8_t* src = s_f8 + (j & 1) * 2 * kBlockN * kF8Stride;
      for (int c = tid; c < 2 * kBlockN * kF8Chunks; c += kThreads) {
        const int kv_row = c / kF8Chunks, col = (c - kv_row * kF8Chunks) * 16;  // K rows, then V
        const uint4 in = *reinterpret_cast<const uint4*>(src + kv_row * kF8Stride + col);
        uint4 lo, hi;
        F8x16Widen<T>(in, lo, hi);
        T* dst = (kv_row < kBlockN ? s_k + kv_row * kStride : s_v + (kv_row - kBlockN) * kStride) +
                 (j & 1) * kBlockN * kStride + col;
        Store16(dst, lo);
        Store16(dst + 8, hi);
      }
      __syncthreads();
    }
    const T* sk = s_k + (j & 1) * kBlockN * kStride;
    const T* sv = s_v + (j & 1) * kBlockN * kStride;

    // S = Q K^T for this warp's rows; each K fragment serves every m-tile.
    float s[kMTiles][kBlockN / 8][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
      for (int i = 0; i < kBlockN / 8; ++i) s[mt][i][0] = s[mt][i][1] = s[mt][i][2] = s[mt][i][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; ++kk) {
      uint32_t qa[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        LdMatrixX4(qa[mt], s_q + (warp_row0 + mt * 16 + lane % 16) * kStride + kk * 16 + (lane / 16) * 8);
      }
#pragma unroll
      for (int nn = 0; nn < kBlockN / 16; ++nn) {
        uint32_t kb[4];
        LdMatrixX4(kb, sk + (nn * 16 + (ldm / 2) * 8 + ldr) * kStride + kk * 16 + (ldm % 2) * 8);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Mma16816<T>(s[mt][2 * nn], qa[mt], kb[0], kb[1]);
          Mma16816<T>(s[mt][2 * nn + 1], qa[mt], kb[2], kb[3]);
        }
      }
    }

    // Scale (and soft-cap), mask (the diagonal tile, keys past the end and, with a window, keys
    // before a row's window), online softmax.
    const int n0 = (first_kv_tile + j) * kBlockN;
    const int warp_last_pos = first_pos + warp_row0 + 16 * kMTiles - 1;
    const bool needs_mask = n0 + kBlockN - 1 > first_pos + warp_row0 || n0 + kBlockN > kv_end ||
                            (a.window > 0 && n0 <= warp_last_pos - a.window);
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      const int pos_a = first_pos + warp_row0 + mt * 16 + lane / 4;  // rows pos_a, pos_a + 8
#pragma unroll
      for (int nt = 0; nt < kBlockN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[mt][nt][e] = a.cap_log2 > 0.0f ? a.cap_log2 * tanhf(s[mt][nt][e] * a.score_scale)
                                           : s[mt][nt][e] * a.score_scale;
          if (needs_mask) {
            const int key = n0 + nt * 8 + 2 * (lane % 4) + (e & 1);
            const int pos = pos_a + (e >= 2 ? 8 : 0);
            if (key > pos || key >= kv_end || (a.window > 0 && key <= pos - a.window)) {
              s[mt][nt][e] = -INFINITY;
            }
          }
        }
      }
      float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < kBlockN / 8; ++nt) {
        row_max[0] = fmaxf(row_max[0], fmaxf(s[mt][nt][0], s[mt][nt][1]));
        row_max[1] = fmaxf(row_max[1], fmaxf(s[mt][nt][2], s[mt][nt][3]));
      }
      float base[2], rescale[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 1));
        row_max[r] = fmaxf(row_max[r], __shfl_xor_sync(0xffffffffu, row_max[r], 2));
        const float m_new = fmaxf(m[mt][r], row_max[r]);
        base[r] = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet stays at zero
        rescale[r] = exp2f(m[mt][r] - base[r]);
        m[mt][r] = m_new;
        l[mt][r] *= rescale[r];
      }
#pragma unroll
      for (int nt = 0; nt < kBlockN / 8; ++nt) {
        s[mt][nt][0] = exp2f(s[mt][nt][0] - base[0]);
        s[mt][nt][1] = exp2f(s[mt][nt][1] - base[0]);
        s[mt][nt][2] = exp2f(s[mt][nt][2] - base[1]);
        s[mt][nt][3] = exp2f(s[mt][nt][3] - base[1]);
        l[mt][0] += s[mt][nt][0] + s[mt][nt][1];
        l[mt][1] += s[mt][nt][2] + s[mt][nt][3];
      }
#pragma unroll
      for (int dt = 0; dt < kHeadDim / 8; ++dt) {
        o[mt][dt][0] *= rescale[0];
        o[mt][dt][1] *= rescale[0];
        o[mt][dt][2] *= rescale[1];
        o[mt][dt][3] *= rescale[1];
      }
    }

    // O += P V, P straight from the score registers (the accumulator layout of two adjacent
    // 8-key tiles is the A-operand layout of one 16-key step); each V fragment serves every m-tile.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t pa[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        pa[mt][0] = Pack2<T>(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][1] = Pack2<T>(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][2] = Pack2<T>(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][3] = Pack2<T>(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dd = 0; dd < kHeadDim / 16; ++dd) {
        uint32_t vb[4];
        LdMatrixX4Trans(vb, sv + (kk * 16 + (ldm % 2) * 8 + ldr) * kStride + dd * 16 + (ldm / 2) * 8);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          Mma16816<T>(o[mt][2 * dd], pa[mt], vb[0], vb[1]);
          Mma16816<T>(o[mt][2 * dd + 1], pa[mt], vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // the next iteration's loads overwrite this buffer
  }

  const int64_t out_stride = int64_t{a.num_heads} * kHeadDim;
  T* out = static_cast<T*>(a.output) + int64_t{seq_token0 + row0} * out_stride +
           int64_t{head} * kHeadDim + 2 * (lane % 4);
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    float inv_l[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 1);
      l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 2);
      inv_l[r] = l[mt][r] > 0.0f ? 1.0f / l[mt][r] : 0.0f;
      if constexpr (kF8) inv_l[r] *= a.out_scale;
    }
    const int row_a = warp_row0 + mt * 16 + lane / 4, row_b = row_a + 8;
#pragma unroll
    for (int dt = 0; dt < kHeadDim / 8; ++dt) {
      if (row_a < rows) {
        *reinterpret_cast<uint32_t*>(out + row_a * out_stride + dt * 8) =
            Pack2<T>(o[mt][dt][0] * inv_l[0], o[mt][dt][1] * inv_l[0]);
      }
      if (row_b < rows) {
        *reinterpret_cast<uint32_t*>(out + row_b * out_stride + dt * 8) =
            Pack2<T>(o[mt][dt][2] * inv_l[1], o[mt][dt][3] * inv_l[1]);
      }
    }
  }
}

template <typename T, int kHeadDim, bool kF8>
cudaError_t LaunchPrefillKernel(const PrefillArgs& a, int64_t num_tokens, cudaStream_t stream) {
  auto kernel = PrefillAttentionKernel<T, kHeadDim, kF8>;
  constexpr int kSmemBytes = PrefillShape<kHeadDim>::kSmemElements * static_cast<int>(sizeof(T)) +
                             (kF8 ? PrefillShape<kHeadDim>::kF8StagingBytes : 0);
  LMSERVE_CUDA_RETURN_IF_ERROR(
      SetMaxDynamicSharedMemory(reinterpret_cast<const void*>(kernel), kSmemBytes));
  const dim3 grid(static_cast<unsigned>(CeilDiv(num_tokens, PrefillShape<kHeadDim>::kBlockM) + a.num_seqs),
                  static_cast<unsigned>(a.num_heads));
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchPrefillPlan(const PrefillAttentionParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.num_seqs == 0) return cudaSuccess;
  const int rows = ChoosePrefillKernel(p) == PrefillKernelKind::kWgmmaSm90
                       ? PrefillSm90TileTokens(p)
                       : static_cast<int>(PrefillBlockRows(p.head_dim));
  PrefillPlanKernel<<<1, kPlanThreads, 0, stream>>>(p.query_start, static_cast<int>(p.num_seqs),
                                                   rows,
                                                   static_cast<int32_t*>(p.workspace));
  return cudaGetLastError();
}

cudaError_t Launch(const PrefillAttentionParams& p, cudaStream_t stream) {
  if (!p.Validate().ok()) return cudaErrorInvalidValue;
  if (p.num_seqs == 0 || p.num_tokens == 0) return cudaSuccess;
  if (!p.plan_ready) LMSERVE_CUDA_RETURN_IF_ERROR(LaunchPrefillPlan(p, stream));
  if (ChoosePrefillKernel(p) == PrefillKernelKind::kWgmmaSm90) return LaunchPrefillSm90(p, stream);
  PrefillArgs a{};
  a.query = p.query;
  a.key_cache = p.key_cache;
  a.value_cache = p.value_cache;
  a.query_start = p.query_start;
  a.context_lens = p.context_lens;
  a.block_table_start = p.block_table_start;
  a.block_table_ids = p.block_table_ids;
  a.tile_start = static_cast<const int32_t*>(p.workspace);
  a.output = p.output;
  a.num_seqs = static_cast<int>(p.num_seqs);
  a.group_size = static_cast<int>(p.num_heads / p.num_kv_heads);
  a.num_kv_heads = static_cast<int>(p.num_kv_heads);
  a.num_heads = static_cast<int>(p.num_heads);
  a.block_size = static_cast<int>(p.block_size);
  a.query_stride = p.query_stride != 0 ? p.query_stride : p.num_heads * p.head_dim;
  a.window = p.window;
  constexpr float kLog2e = 1.4426950408889634f;
  if (p.softcap > 0) {
    a.score_scale = p.scale / p.softcap;
    a.cap_log2 = p.softcap * kLog2e;
  } else {
    a.score_scale = p.scale * kLog2e;
    a.cap_log2 = 0.0f;
  }
  return DispatchActivationDType(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (p.cache_fp8) {
      a.score_scale *= p.k_scale;
      a.out_scale = p.v_scale;
    }
    return DispatchHeadDim(p.head_dim, [&](auto head_dim_constant) {
      constexpr int kHeadDim = decltype(head_dim_constant)::value;
      return p.cache_fp8 ? LaunchPrefillKernel<T, kHeadDim, true>(a, p.num_tokens, stream)
                         : LaunchPrefillKernel<T, kHeadDim, false>(a, p.num_tokens, stream);
    });
  });
}

}  // namespace lmserve::kernels::cuda
