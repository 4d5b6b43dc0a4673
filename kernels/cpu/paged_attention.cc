#include "kernels/cpu/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/strings.h"
#include "kernels/cpu/check.h"
#include "kernels/cpu/fast_exp.h"
#include "kernels/cpu/parallel.h"

namespace lmserve::kernels {
namespace {

// Features of a head whose weighted sum over the values stays in registers.
constexpr int64_t kValueChunk = 32;
// Keys ahead whose rows are prefetched in QK^T.
constexpr int64_t kPrefetchKeys = 8;
// Query rows of one sequence that one work item handles.
constexpr int64_t kRowsPerItem = 16;
// Below this many multiply-adds in QK^T, threads cost more than they save.
// (A decode step of the demo model, 9 heads of 64 at 160 keys: 92K; one of its layers' attention
// took some 40 us on one thread, a parallel loop's start and end a few.)
constexpr int64_t kMinWorkPerThread = int64_t{1} << 15;

// fp32 dot product with eight independent partial sums (which the compiler vectorizes).
inline float Dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  }
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

// The first key position a query at `position` sees: position - window + 1 (at least 0) with a
// sliding window, else 0.
inline int64_t FirstKey(int64_t position, int32_t window) {
  return window > 0 ? std::max<int64_t>(0, position - window + 1) : 0;
}

// Attention for query rows [row_begin, row_end) of sequence `seq`, the query heads of KV head
// `kv_head`. `scores` holds group_size * max_context_len floats.
//
// AVX2 where the CPU has it: the same operations in wider registers (no FMA, which would let the
// compiler contract a * b + c and change the rounding from one CPU to another).
// Only the group's query heads [head_begin, head_end) (each head's results do not depend on the
// others').
__attribute__((target_clones("avx2", "default"))) void AttendRows(const PagedAttentionParams& p,
                                                                  int64_t seq, int64_t kv_head,
                                                                  int64_t head_begin,
                                                                  int64_t head_end,
                                                                  int64_t row_begin,
                                                                  int64_t row_end, float* scores) {
  const int64_t head_dim = p.head_dim;
  const int64_t group_size = head_end - head_begin;
  const int64_t q_stride = p.query_stride != 0 ? p.query_stride : p.num_heads * head_dim;
  const int64_t kv_token_stride = p.num_kv_heads * head_dim;
  const int64_t query_len = p.query_start[seq + 1] - p.query_start[seq];
  const int64_t first_position = p.context_lens[seq] - query_len;
  const int32_t* table = p.block_table_ids + p.block_table_start[seq];
  const bool capped = p.softcap > 0;

  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t token = p.query_start[seq] + row;
    const int64_t position = first_position + row;
    const int64_t first_key = FirstKey(position, p.window);  // keys [first_key, position]
    const int64_t num_keys = position + 1 - first_key;
    const int64_t first_head = kv_head * (p.num_heads / p.num_kv_heads) + head_begin;
    const float* q = p.query + token * q_stride + first_head * head_dim;

    // Scores, head h's of key first_key + j at scores[h * num_keys + j]. Keys are walked a block
    // (or the part of one in the window) at a time.
    for (int64_t j0 = first_key; j0 <= position;) {
      const int64_t block = table[j0 / p.block_size];
      const int64_t offset = j0 % p.block_size;
      const int64_t count = std::min(p.block_size - offset, position + 1 - j0);
      const float* keys =
          p.key_cache + (block * p.block_size + offset) * kv_token_stride + kv_head * head_dim;
      for (int64_t o = 0; o < count; ++o) {
        const float* k = keys + o * kv_token_stride;
        if (o + kPrefetchKeys < count) {  // the cache is cold: the weights streamed through since
          const float* ahead = k + kPrefetchKeys * kv_token_stride;
          for (int64_t d = 0; d < head_dim; d += 16) __builtin_prefetch(ahead + d);
        }
        for (int64_t h = 0; h < group_size; ++h) {
          float s = Dot(q + h * head_dim, k, head_dim) * p.scale;
          if (capped) s = p.softcap * std::tanh(s / p.softcap);
          scores[h * num_keys + j0 - first_key + o] = s;
        }
      }
      j0 += count;
    }
    // Softmax per head: subtract the maximum, exponentiate, normalize (the sum in double).
    for (int64_t h = 0; h < group_size; ++h) {
      float* s = scores + h * num_keys;
      float max_score = s[0];
      for (int64_t j = 1; j < num_keys; ++j) max_score = std::max(max_score, s[j]);
      ExpShifted(s, num_keys, max_score);
      double partial[8] = {};  // in eight partial sums, which vectorize
      int64_t j = 0;
      for (; j + 8 <= num_keys; j += 8) {
        for (int k = 0; k < 8; ++k) partial[k] += s[j + k];
      }
      for (; j < num_keys; ++j) partial[0] += s[j];
      const double sum = ((partial[0] + partial[4]) + (partial[1] + partial[5])) +
                         ((partial[2] + partial[6]) + (partial[3] + partial[7]));
      const float inv_sum = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < num_keys; ++j) s[j] *= inv_sum;
    }
    // Weighted sum of the values: kValueChunk features of one head at a time, summed in registers
    // over the keys in order from 0 (a running sum in memory waited on its own stores).
    float* out = p.output + token * p.num_heads * head_dim + first_head * head_dim;
    for (int64_t h = 0; h < group_size; ++h) {
      const float* weights = scores + h * num_keys;
      for (int64_t d0 = 0; d0 < head_dim; d0 += kValueChunk) {
        const int64_t width = std::min(kValueChunk, head_dim - d0);
        float acc[kValueChunk] = {};
        for (int64_t j0 = first_key; j0 <= position;) {
          const int64_t block = table[j0 / p.block_size];
          const int64_t offset = j0 % p.block_size;
          const int64_t count = std::min(p.block_size - offset, position + 1 - j0);
          const float* values = p.value_cache +
                                (block * p.block_size + offset) * kv_token_stride +
                                kv_head * head_dim + d0;
          const float* w = weights + (j0 - first_key);
          if (width == kValueChunk) {
            for (int64_t o = 0; o < count; ++o) {
              const float* v = values + o * kv_token_stride;
              for (int64_t d = 0; d < kValueChunk; ++d) acc[d] += w[o] * v[d];
            }
          } else {
            for (int64_t o = 0; o < count; ++o) {
              const float* v = values + o * kv_token_stride;
              for (int64_t d = 0; d < width; ++d) acc[d] += w[o] * v[d];
            }
          }
          j0 += count;
        }
        std::memcpy(out + h * head_dim + d0, acc, static_cast<size_t>(width) * sizeof(float));
      }
    }
  }
}

// Runs the work items i with i % num_workers == worker: (sequence, KV head, chunk of query rows),
// or with split_heads (decode steps: too few items to go round the threads), (sequence, KV head,
// chunk of query rows, query head).
void RunWorker(const PagedAttentionParams& p, int worker, int num_workers, bool split_heads,
               float* scores) {
  const int64_t group_size = p.num_heads / p.num_kv_heads;
  const int64_t head_step = split_heads ? 1 : group_size;
  int64_t item = 0;
  for (int64_t seq = 0; seq < p.num_seqs; ++seq) {
    const int64_t query_len = p.query_start[seq + 1] - p.query_start[seq];
    for (int64_t kv_head = 0; kv_head < p.num_kv_heads; ++kv_head) {
      for (int64_t row = 0; row < query_len; row += kRowsPerItem) {
        for (int64_t h = 0; h < group_size; h += head_step, ++item) {
          if (item % num_workers != worker) continue;
          AttendRows(p, seq, kv_head, h, h + head_step, row,
                     std::min(query_len, row + kRowsPerItem), scores);
        }
      }
    }
  }
}

absl::Status Invalid(std::string message) {
  return absl::InvalidArgumentError(StrCat("PagedAttention: ", message));
}

// Checks the shared cache geometry of both kernels.
absl::Status ValidateGeometry(const char* kernel, int64_t num_kv_heads, int64_t head_dim,
                              int64_t block_size, int64_t num_blocks) {
  if (head_dim <= 0 || head_dim % 2 != 0 || head_dim > PagedAttentionParams::kMaxHeadDim) {
    return absl::InvalidArgumentError(StrCat(kernel, ": head_dim ", head_dim,
                                             " is not supported (even, at most ",
                                             PagedAttentionParams::kMaxHeadDim, ")"));
  }
  if (num_kv_heads <= 0 || block_size <= 0 || num_blocks <= 0) {
    return absl::InvalidArgumentError(StrCat(kernel, ": num_kv_heads (", num_kv_heads,
                                             "), block_size (", block_size, ") and num_blocks (",
                                             num_blocks, ") must be positive"));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t PagedAttentionParams::WorkspaceFloats(int64_t max_context_len, int64_t num_heads,
                                              int64_t num_kv_heads, int num_threads) {
  const int64_t group_size = num_kv_heads > 0 ? num_heads / num_kv_heads : 0;
  return std::max(1, num_threads) * group_size * max_context_len;
}

absl::Status PagedAttentionParams::Validate() const {
  if (absl::Status s =
          ValidateGeometry("PagedAttention", num_kv_heads, head_dim, block_size, num_blocks);
      !s.ok()) {
    return s;
  }
  if (num_heads <= 0 || num_heads % num_kv_heads != 0) {
    return Invalid(StrCat("num_heads (", num_heads,
                          ") must be a positive multiple of num_kv_heads (", num_kv_heads, ")"));
  }
  if (num_seqs < 0 || num_tokens < 0 || max_context_len < 0 || num_threads < 1) {
    return Invalid("negative num_seqs, num_tokens or max_context_len, or num_threads < 1");
  }
  if (query_stride != 0 && query_stride < num_heads * head_dim) {
    return Invalid(StrCat("query_stride ", query_stride, " is smaller than a row"));
  }
  if (!(scale > 0) || !std::isfinite(scale)) return Invalid("scale must be positive and finite");
  if (window < 0) return Invalid(StrCat("window ", window, " is negative"));
  if (!(softcap >= 0) || !std::isfinite(softcap)) {
    return Invalid("softcap must be 0 (none) or positive and finite");
  }
  if (num_seqs == 0) {
    if (num_tokens != 0) return Invalid("tokens without sequences");
    return absl::OkStatus();
  }
  if (query == nullptr || key_cache == nullptr || value_cache == nullptr ||
      query_start == nullptr || context_lens == nullptr || block_table_start == nullptr ||
      block_table_ids == nullptr || output == nullptr || workspace == nullptr) {
    return Invalid("a null pointer");
  }
  if (query_start[0] != 0 || block_table_start[0] != 0) {
    return Invalid("query_start[0] and block_table_start[0] must be 0");
  }
  if (query_start[num_seqs] != num_tokens) {
    return Invalid(
        StrCat("query_start[num_seqs] is ", query_start[num_seqs], ", num_tokens ", num_tokens));
  }
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t query_len = int64_t{query_start[i + 1]} - query_start[i];
    const int64_t num_table_blocks = int64_t{block_table_start[i + 1]} - block_table_start[i];
    if (query_len < 1 || query_len > context_lens[i] || context_lens[i] > max_context_len) {
      return Invalid(StrCat("sequence ", i, ": query length ", query_len, ", context length ",
                            context_lens[i], " (want 1 <= query <= context <= max_context_len ",
                            max_context_len, ")"));
    }
    if (num_table_blocks < 0 || num_table_blocks * block_size < context_lens[i]) {
      return Invalid(StrCat("sequence ", i, ": ", num_table_blocks, " blocks of ", block_size,
                            " do not cover its context of ", context_lens[i]));
    }
    // Blocks wholly before the first key the sequence's first query token sees may be -1.
    const int64_t first_key = FirstKey(context_lens[i] - query_len, window);
    for (int64_t b = block_table_start[i]; b < block_table_start[i + 1]; ++b) {
      const bool before_window = (b - block_table_start[i] + 1) * block_size <= first_key;
      if (before_window && block_table_ids[b] == -1) continue;
      if (block_table_ids[b] < 0 || block_table_ids[b] >= num_blocks) {
        return Invalid(StrCat("sequence ", i, ": block id ", block_table_ids[b], " outside [0, ",
                              num_blocks, ")"));
      }
    }
  }
  return absl::OkStatus();
}

void PagedAttention(const PagedAttentionParams& p) {
  CheckValid(p.Validate(), "PagedAttention");
  const int64_t scratch_floats = (p.num_heads / p.num_kv_heads) * p.max_context_len;
  int64_t work = 0;  // multiply-adds of QK^T, an estimate of the whole
  for (int64_t i = 0; i < p.num_seqs; ++i) {
    const int64_t keys = p.window > 0 ? std::min<int64_t>(p.window, p.context_lens[i])
                                      : p.context_lens[i];
    work += int64_t{p.query_start[i + 1] - p.query_start[i]} * keys;
  }
  work *= p.num_heads * p.head_dim;
  const int num_workers = ThreadsForWork(work, kMinWorkPerThread, p.num_threads);
  if (num_workers == 1) {
    RunWorker(p, 0, 1, false, p.workspace);
    return;
  }
  int64_t items = 0;  // (sequence, KV head, row chunk) items
  for (int64_t i = 0; i < p.num_seqs; ++i) {
    items += p.num_kv_heads *
             ((p.query_start[i + 1] - p.query_start[i] + kRowsPerItem - 1) / kRowsPerItem);
  }
  const bool split_heads = items < 4 * int64_t{num_workers};
  ParallelFor(num_workers, num_workers, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      RunWorker(p, static_cast<int>(w), num_workers, split_heads, p.workspace + w * scratch_floats);
    }
  });
}

absl::Status WriteKvCacheParams::Validate() const {
  if (absl::Status s =
          ValidateGeometry("WriteKvCache", num_kv_heads, head_dim, block_size, num_blocks);
      !s.ok()) {
    return s;
  }
  if (num_tokens < 0) return absl::InvalidArgumentError("WriteKvCache: num_tokens is negative");
  if (num_tokens == 0) return absl::OkStatus();
  if (key == nullptr || value == nullptr || slot_mapping == nullptr || key_cache == nullptr ||
      value_cache == nullptr) {
    return absl::InvalidArgumentError("WriteKvCache: a null pointer");
  }
  if ((key_stride != 0 && key_stride < num_kv_heads * head_dim) ||
      (value_stride != 0 && value_stride < num_kv_heads * head_dim)) {
    return absl::InvalidArgumentError("WriteKvCache: a row stride is smaller than a row");
  }
  const int64_t num_slots = num_blocks * block_size;
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (slot_mapping[t] < 0 || slot_mapping[t] >= num_slots) {
      return absl::InvalidArgumentError(StrCat("WriteKvCache: token ", t, " has slot ",
                                               slot_mapping[t], " outside [0, ", num_slots, ")"));
    }
  }
  return absl::OkStatus();
}

void WriteKvCache(const WriteKvCacheParams& p) {
  CheckValid(p.Validate(), "WriteKvCache");
  const int64_t row = p.num_kv_heads * p.head_dim;
  const int64_t k_stride = p.key_stride != 0 ? p.key_stride : row;
  const int64_t v_stride = p.value_stride != 0 ? p.value_stride : row;
  const size_t row_bytes = static_cast<size_t>(row) * sizeof(float);
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    std::memcpy(p.key_cache + p.slot_mapping[t] * row, p.key + t * k_stride, row_bytes);
    std::memcpy(p.value_cache + p.slot_mapping[t] * row, p.value + t * v_stride, row_bytes);
  }
}

}  // namespace lmserve::kernels
