// A CUDA step's inputs: the batch's ids, positions, cache slots, block tables, logits rows and
// sampling settings, packed into one pinned buffer and copied to the device in one transfer.

#ifndef LMSERVE_ENGINE_RUNNER_CUDA_STEP_INPUTS_H_
#define LMSERVE_ENGINE_RUNNER_CUDA_STEP_INPUTS_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runner/cuda/cuda_buffer.h"
#include "engine/runner/model_runner.h"

namespace lmserve::engine::cuda {

// Where each input array of a step lies in the packed buffer (host and device alike). The offsets
// depend only on the counts, so a CUDA graph captured for a decode bucket finds its inputs at the
// same addresses on every replay; the block table ids, whose count varies, come last.
//
// KV cache groups (kv_cache_groups.h): each group has its cache slots and its block tables. The
// slots are group by group ([groups, tokens]); so are the tables' starts ([groups, seqs + 1], each
// group's starts as offsets into the one array of ids, which holds group 0's tables, then group
// 1's, ...): a layer of group g reads slots + g * tokens and block_table_start + g * (seqs + 1).
struct StepLayout {
  size_t mask_step = 0;          // uint64 [1]: the step number its masked rows wait for (the
                                 // gated token bitmask, kernels/cuda/token_bitmask.h)
  size_t slots = 0;              // int64 [groups, tokens]: each token's cache slot; -1: padding
  size_t seeds = 0;              // uint64 [rows]
  size_t steps = 0;              // uint64 [rows]
  size_t token_ids = 0;          // int32 [tokens]
  size_t positions = 0;          // int32 [tokens]
  size_t query_start = 0;        // int32 [seqs + 1]
  // int32 [seqs + 1]: the query starts of the sequences after the leading ones of one token
  // (one_token_prefix of them), from 0: that part of the step as a batch of its own.
  size_t tail_query_start = 0;
  size_t context_lens = 0;       // int32 [seqs]
  size_t state_slots = 0;        // int32 [seqs]: StepBatch::state_slots (0 where none, padding)
  size_t block_table_start = 0;  // int32 [groups, seqs + 1]
  size_t logits_rows = 0;        // int32 [rows]: the token of each logits row
  size_t temperature = 0;        // float [rows]
  size_t top_k = 0;              // int32 [rows]
  size_t top_p = 0;              // float [rows]
  size_t min_p = 0;              // float [rows]
  size_t mask_index = 0;         // int32 [rows]: a masked row's sequence (its bitmask row), else -1
  size_t block_table_ids = 0;    // int32 [table ids]
  // int32 [pending, 2]: each StepBatch::pending_tokens entry as (its token, the logits row of the
  // launched step's draw); read by the kernel that writes them into token_ids, outside graphs.
  size_t pending_pairs = 0;
  size_t total = 0;
  // Not an offset: how many of the step's first sequences have one new token each (Pack's
  // count; every sequence in a decode-only step). Attention runs them on the decode kernel and
  // the rest, from tail_query_start, on the prefill kernel.
  int64_t one_token_prefix = 0;
  int64_t num_pending = 0;  // pairs at pending_pairs

  static StepLayout For(int64_t tokens, int64_t seqs, int64_t rows, int64_t table_ids,
                        int64_t groups, int64_t pending = 0);
};

// A row of the step's logits on the device: a kLast or kSample sequence's last token, each token
// of a kAll sequence, or a padding sequence's token in a padded decode step.
struct LogitsRow {
  int32_t token = 0;        // its token in the step
  int32_t seq = -1;         // its sequence; -1 for padding
  bool sampled = false;     // a kSample row: the device draws its token, no logits come back
  int64_t output_row = -1;  // its row in StepOutput::logits; -1 for sampled and padding rows
};

class StepInputs {
 public:
  // Room for steps of up to `max_tokens` tokens and logits rows, `max_seqs` sequences and
  // `max_table_ids` block table entries (every group's), for a model of `num_groups` KV cache
  // groups.
  static absl::StatusOr<StepInputs> Create(int64_t max_tokens, int64_t max_seqs,
                                           int64_t max_table_ids, int64_t num_groups);

  // Packs `batch` (REQUIRES: valid, within the limits, num_groups tables a sequence) into the host
  // buffer. A decode-only step run by a graph of `padded_seqs` sequences is padded to it: padding
  // sequences have context 0, empty tables and cache slot -1, so they read and write nothing, and
  // a greedy logits row each. `mask_step`: the number whose release the step's masked rows wait
  // for. Fills rows().
  // `split`: count StepLayout::one_token_prefix (else 0 outside a decode-only step).
  // `launched_rows`: the logits row of each sequence of the step launched before (async
  // scheduling), for batch.pending_tokens (REQUIRES: each names a row there).
  // Two host buffers alternate, so that a step is packed while the one before may still wait for
  // its copy.
  StepLayout Pack(const StepBatch& batch, int64_t padded_seqs, bool decode_only,
                  int32_t block_size_tokens, uint64_t mask_step = 0, bool split = true,
                  std::span<const int32_t> launched_rows = {});
  // Copies the packed inputs of `layout` to the device, on `stream`.
  absl::Status Upload(const StepLayout& layout, cudaStream_t stream) const;

  // Device address of the array at `offset` of the last packed layout.
  template <typename T>
  const T* Device(size_t offset) const {
    return device_.at<const T>(static_cast<int64_t>(offset));
  }

  const std::vector<LogitsRow>& rows() const { return rows_; }
  int64_t device_bytes() const { return device_.bytes(); }

 private:
  template <typename T>
  T* Host(size_t offset) const {
    return hosts_[host_index_].at<T>(static_cast<int64_t>(offset));
  }

  int64_t num_groups_ = 1;
  CudaBuffer hosts_[2];  // pinned; Pack fills hosts_[host_index_]
  int host_index_ = 0;
  CudaBuffer device_;
  std::vector<LogitsRow> rows_;
};

}  // namespace lmserve::engine::cuda

#endif  // LMSERVE_ENGINE_RUNNER_CUDA_STEP_INPUTS_H_
