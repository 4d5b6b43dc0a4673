#include "engine/runner/cuda/step_inputs.h"

#include <cstring>
#include <span>

#include "common/status.h"

namespace lmserve::engine::cuda {

StepLayout StepLayout::For(int64_t tokens, int64_t seqs, int64_t rows, int64_t table_ids,
                           int64_t groups, int64_t pending) {
  StepLayout l;
  size_t offset = 0;
  auto take = [&offset](int64_t bytes) {
    const size_t at = offset;
    offset = (offset + static_cast<size_t>(bytes) + 15) / 16 * 16;
    return at;
  };
  l.mask_step = take(8);
  l.slots = take(8 * groups * tokens);
  l.seeds = take(8 * rows);
  l.steps = take(8 * rows);
  l.token_ids = take(4 * tokens);
  l.positions = take(4 * tokens);
  l.query_start = take(4 * (seqs + 1));
  l.tail_query_start = take(4 * (seqs + 1));
  l.context_lens = take(4 * seqs);
  l.state_slots = take(4 * seqs);
  l.block_table_start = take(4 * groups * (seqs + 1));
  l.logits_rows = take(4 * rows);
  l.temperature = take(4 * rows);
  l.top_k = take(4 * rows);
  l.top_p = take(4 * rows);
  l.min_p = take(4 * rows);
  l.mask_index = take(4 * rows);
  l.block_table_ids = take(4 * table_ids);
  l.pending_pairs = take(8 * pending);
  l.num_pending = pending;
  l.total = offset;
  return l;
}

absl::StatusOr<StepInputs> StepInputs::Create(int64_t max_tokens, int64_t max_seqs,
                                              int64_t max_table_ids, int64_t num_groups) {
  const int64_t capacity = static_cast<int64_t>(
      StepLayout::For(max_tokens, max_seqs, max_tokens, max_table_ids, num_groups, max_tokens)
          .total);
  StepInputs inputs;
  inputs.num_groups_ = num_groups;
  for (CudaBuffer& host : inputs.hosts_) {
    LMSERVE_ASSIGN_OR_RETURN(host, CudaBuffer::Pinned(capacity, "step inputs"));
  }
  LMSERVE_ASSIGN_OR_RETURN(inputs.device_, CudaBuffer::Device(capacity, "step inputs"));
  return inputs;
}

StepLayout StepInputs::Pack(const StepBatch& batch, int64_t padded_seqs, bool decode_only,
                            int32_t block_size, uint64_t mask_step, bool split,
                            std::span<const int32_t> launched_rows) {
  host_index_ ^= 1;
  const int64_t seqs = batch.num_seqs();
  const int64_t tokens = decode_only ? padded_seqs : batch.num_tokens();
  // Device rows: every kLast/kSample sequence's last token, every kAll sequence's tokens; a
  // padded decode step gives its padding sequences a row each (greedy, ignored).
  rows_.clear();
  int64_t num_output_rows = 0;
  for (int64_t i = 0; i < seqs; ++i) {
    const int32_t begin = batch.query_start[i], end = batch.query_start[i + 1];
    const int32_t seq = static_cast<int32_t>(i);
    switch (batch.logits_modes[i]) {
      case LogitsMode::kNone:
        break;
      case LogitsMode::kLast:
        rows_.push_back({.token = end - 1, .seq = seq, .output_row = num_output_rows++});
        break;
      case LogitsMode::kSample:
        rows_.push_back({.token = end - 1, .seq = seq, .sampled = true});
        break;
      case LogitsMode::kAll:
        for (int32_t t = begin; t < end; ++t) {
          rows_.push_back({.token = t, .seq = seq, .output_row = num_output_rows++});
        }
        break;
    }
  }
  for (int64_t i = seqs; i < padded_seqs; ++i) {
    rows_.push_back({.token = static_cast<int32_t>(i)});
  }
  const int64_t rows = static_cast<int64_t>(rows_.size());
  const int64_t table_ids = static_cast<int64_t>(batch.block_table_ids.size());
  const int64_t layout_seqs = decode_only ? padded_seqs : seqs;
  const int64_t groups = num_groups_;
  const auto pending = static_cast<int64_t>(batch.pending_tokens.size());
  StepLayout l = StepLayout::For(tokens, layout_seqs, rows, table_ids, groups, pending);
  l.one_token_prefix = decode_only ? layout_seqs : 0;
  while (split && l.one_token_prefix < seqs &&
         batch.query_start[l.one_token_prefix + 1] - batch.query_start[l.one_token_prefix] == 1) {
    ++l.one_token_prefix;
  }

  *Host<uint64_t>(l.mask_step) = mask_step;
  int64_t* slots = Host<int64_t>(l.slots);
  int32_t* ids = Host<int32_t>(l.token_ids);
  int32_t* positions = Host<int32_t>(l.positions);
  int32_t* query_start = Host<int32_t>(l.query_start);
  int32_t* context_lens = Host<int32_t>(l.context_lens);
  int32_t* state_slots = Host<int32_t>(l.state_slots);
  const bool has_slots = static_cast<int64_t>(batch.state_slots.size()) == seqs;
  int32_t* table_start = Host<int32_t>(l.block_table_start);
  for (int64_t i = 0; i < seqs; ++i) {
    const int32_t begin = batch.query_start[i], end = batch.query_start[i + 1];
    const int32_t first_position = batch.context_lens[i] - (end - begin);
    for (int32_t t = begin; t < end; ++t) {
      ids[t] = batch.token_ids[t];
      positions[t] = first_position + (t - begin);
    }
    query_start[i] = begin;
    context_lens[i] = batch.context_lens[i];
    state_slots[i] = has_slots ? batch.state_slots[i] : 0;
  }
  for (int64_t i = seqs; i < layout_seqs; ++i) {  // padding: nothing read, nothing written
    ids[i] = 0;
    positions[i] = 0;
    query_start[i] = static_cast<int32_t>(i);
    context_lens[i] = 0;
    state_slots[i] = 0;
  }
  query_start[layout_seqs] = static_cast<int32_t>(tokens);
  int32_t* tail_query_start = Host<int32_t>(l.tail_query_start);
  for (int64_t i = l.one_token_prefix; i <= layout_seqs; ++i) {
    tail_query_start[i - l.one_token_prefix] =
        query_start[i] - static_cast<int32_t>(l.one_token_prefix);
  }
  // Each group's slots and tables in turn (the batch holds them sequence by sequence).
  int32_t* table_ids_out = Host<int32_t>(l.block_table_ids);
  int32_t num_ids = 0;
  for (int64_t g = 0; g < groups; ++g) {
    int64_t* group_slots = slots + g * tokens;
    int32_t* group_start = table_start + g * (layout_seqs + 1);
    for (int64_t i = 0; i < seqs; ++i) {
      const std::span<const int32_t> table =
          batch.BlockTable(static_cast<int32_t>(i), static_cast<int32_t>(g));
      for (int32_t t = batch.query_start[i]; t < batch.query_start[i + 1]; ++t) {
        const int32_t position = positions[t];
        group_slots[t] = int64_t{table[static_cast<size_t>(position / block_size)]} * block_size +
                         position % block_size;
      }
      group_start[i] = num_ids;
      if (!table.empty()) {
        std::memcpy(table_ids_out + num_ids, table.data(), table.size() * 4);
      }
      num_ids += static_cast<int32_t>(table.size());
    }
    for (int64_t i = seqs; i < layout_seqs; ++i) {
      group_slots[i] = -1;
      group_start[i] = num_ids;
    }
    group_start[layout_seqs] = num_ids;
  }
  int32_t* logits_rows = Host<int32_t>(l.logits_rows);
  float* temperature = Host<float>(l.temperature);
  int32_t* top_k = Host<int32_t>(l.top_k);
  float* top_p = Host<float>(l.top_p);
  float* min_p = Host<float>(l.min_p);
  uint64_t* seeds = Host<uint64_t>(l.seeds);
  uint64_t* steps = Host<uint64_t>(l.steps);
  int32_t* mask_index = Host<int32_t>(l.mask_index);
  for (int64_t r = 0; r < rows; ++r) {
    logits_rows[r] = rows_[r].token;
    RunnerSampling s;  // greedy: rows that only return logits, and padding
    if (rows_[r].sampled) s = batch.sampling[rows_[r].seq];
    temperature[r] = s.temperature;
    top_k[r] = s.top_k;
    top_p[r] = s.top_p;
    min_p[r] = s.min_p;
    seeds[r] = s.seed;
    steps[r] = s.step;
    mask_index[r] = rows_[r].sampled && s.masked ? rows_[r].seq : -1;
  }
  int32_t* pairs = Host<int32_t>(l.pending_pairs);
  for (int64_t i = 0; i < pending; ++i) {
    const PendingToken& p = batch.pending_tokens[static_cast<size_t>(i)];
    pairs[2 * i] = p.token;
    pairs[2 * i + 1] = launched_rows[static_cast<size_t>(p.launched_seq)];
  }
  return l;
}

absl::Status StepInputs::Upload(const StepLayout& layout, cudaStream_t stream) const {
  LMSERVE_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(device_.get(), hosts_[host_index_].get(),
                                               layout.total, cudaMemcpyHostToDevice, stream),
                               "copying the step's inputs");
  return absl::OkStatus();
}

}  // namespace lmserve::engine::cuda
