#include "engine/runner/model_runner.h"

#include <algorithm>
#include <new>

#include "common/status.h"
#include "common/strings.h"
#include "engine/core/check.h"
#include "engine/model/family.h"
#include "engine/model/kv_cache_groups.h"
#include "engine/model/ops.h"
#include "engine/runner/cpu_runner.h"
#include "engine/runner/cuda_runner.h"
#include "engine/runner/tensor_parallel_runner.h"

namespace lmserve::engine {
namespace {

absl::Status Malformed(std::string message) {
  return absl::InvalidArgumentError(StrCat("step batch: ", message));
}

}  // namespace

std::string_view RunnerDTypeName(RunnerDType dtype) {
  switch (dtype) {
    case RunnerDType::kAuto:
      return "auto";
    case RunnerDType::kBFloat16:
      return "bfloat16";
    case RunnerDType::kFloat32:
      return "float32";
    case RunnerDType::kNative:
      return "native";
  }
  return "unknown";
}

std::optional<RunnerDType> RunnerDTypeFromName(std::string_view name) {
  for (RunnerDType dtype : {RunnerDType::kAuto, RunnerDType::kBFloat16, RunnerDType::kFloat32,
                            RunnerDType::kNative}) {
    if (RunnerDTypeName(dtype) == name) return dtype;
  }
  return std::nullopt;
}

RunnerDType ResolveRunnerDType(RunnerDType dtype, Backend backend) {
  if (dtype != RunnerDType::kAuto) return dtype;
  return backend == Backend::kCuda ? RunnerDType::kBFloat16 : RunnerDType::kNative;
}

int64_t RunnerDTypeBytes(RunnerDType dtype) { return dtype == RunnerDType::kFloat32 ? 4 : 2; }

std::span<const int32_t> StepBatch::BlockTable(int32_t seq, int32_t group) const {
  const int64_t row = int64_t{seq} * num_kv_groups + group;
  const int32_t begin = block_table_start[static_cast<size_t>(row)];
  const int32_t end = block_table_start[static_cast<size_t>(row + 1)];
  return std::span<const int32_t>(block_table_ids)
      .subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
}

void StepBatch::AddSequence(std::span<const int32_t> new_tokens, int32_t num_computed_tokens,
                            std::span<const int32_t> block_ids, LogitsMode logits_mode,
                            int32_t state_slot) {
  LMSERVE_CORE_CHECK(num_kv_groups == 1, "a batch of ", num_kv_groups,
                     " KV cache groups needs a table per group");
  const std::span<const int32_t> tables[1] = {block_ids};
  AddSequence(new_tokens, num_computed_tokens, tables, logits_mode, state_slot);
}

void StepBatch::AddSequence(std::span<const int32_t> new_tokens, int32_t num_computed_tokens,
                            std::span<const std::span<const int32_t>> group_block_ids,
                            LogitsMode logits_mode, int32_t state_slot) {
  state_slots.push_back(state_slot >= 0 ? state_slot : num_seqs());
  if (num_seqs() == 0) num_kv_groups = static_cast<int32_t>(group_block_ids.size());
  LMSERVE_CORE_CHECK(static_cast<int32_t>(group_block_ids.size()) == num_kv_groups, "a sequence ",
                     "with ", group_block_ids.size(), " block tables in a batch of ", num_kv_groups,
                     " KV cache groups");
  if (query_start.empty()) query_start.push_back(0);
  if (block_table_start.empty()) block_table_start.push_back(0);
  token_ids.insert(token_ids.end(), new_tokens.begin(), new_tokens.end());
  query_start.push_back(num_tokens());
  context_lens.push_back(num_computed_tokens + static_cast<int32_t>(new_tokens.size()));
  for (std::span<const int32_t> block_ids : group_block_ids) {
    block_table_ids.insert(block_table_ids.end(), block_ids.begin(), block_ids.end());
    block_table_start.push_back(static_cast<int32_t>(block_table_ids.size()));
  }
  logits_modes.push_back(logits_mode);
}

absl::Status ModelRunner::Launch(const StepBatch& batch, StepOutput* output) {
  pending_batch_ = &batch;
  pending_output_ = output;
  return absl::OkStatus();
}

absl::Status ModelRunner::Finish() {
  if (pending_batch_ == nullptr) return absl::FailedPreconditionError("Finish without a Launch");
  const StepBatch* batch = pending_batch_;
  StepOutput* output = pending_output_;
  pending_batch_ = nullptr;
  pending_output_ = nullptr;
  return Execute(*batch, output);
}

void StepBatch::Clear() {
  token_ids.clear();
  query_start.clear();
  context_lens.clear();
  block_table_start.clear();
  block_table_ids.clear();
  logits_modes.clear();
  sampling.clear();
  state_slots.clear();
  token_bitmask.clear();
  pending_tokens.clear();
  num_kv_groups = 1;
}

absl::Status ValidateStepBatch(const StepBatch& batch, const ModelConfig& config,
                               int32_t block_size_tokens, int32_t num_kv_blocks,
                               std::span<const int32_t> kv_group_windows,
                               int32_t num_state_slots) {
  const int64_t num_seqs = batch.num_seqs();
  const int64_t num_tokens = batch.num_tokens();
  const int32_t kFullAttention[1] = {0};
  const std::span<const int32_t> windows =
      kv_group_windows.empty() ? std::span<const int32_t>(kFullAttention) : kv_group_windows;
  const int64_t num_groups = static_cast<int64_t>(windows.size());
  if (num_seqs == 0) {
    // The empty batch, as constructed or after Clear().
    const bool empty_starts = batch.query_start.size() <= 1 &&
                              batch.block_table_start.size() <= 1 &&
                              (batch.query_start.empty() || batch.query_start[0] == 0) &&
                              (batch.block_table_start.empty() || batch.block_table_start[0] == 0);
    if (num_tokens != 0 || !batch.block_table_ids.empty() || !batch.logits_modes.empty() ||
        !empty_starts) {
      return Malformed("no sequences (context_lens is empty) but tokens, tables or modes given");
    }
    return absl::OkStatus();
  }
  if (batch.num_kv_groups != num_groups) {
    return Malformed(StrCat("the batch has block tables for ", batch.num_kv_groups,
                            " KV cache groups; the model has ", num_groups));
  }
  const int64_t num_tables = num_seqs * num_groups;
  if (static_cast<int64_t>(batch.query_start.size()) != num_seqs + 1 ||
      static_cast<int64_t>(batch.block_table_start.size()) != num_tables + 1 ||
      static_cast<int64_t>(batch.logits_modes.size()) != num_seqs) {
    return Malformed(StrCat(num_seqs, " sequences but ", batch.query_start.size(), " query_start, ",
                            batch.block_table_start.size(), " block_table_start and ",
                            batch.logits_modes.size(), " logits_modes entries (want n + 1, n * ",
                            num_groups, " + 1 and n)"));
  }
  if (batch.query_start[0] != 0 || batch.query_start[num_seqs] != num_tokens) {
    return Malformed(StrCat("query_start runs from ", batch.query_start[0], " to ",
                            batch.query_start[num_seqs], "; want 0 to num_tokens (", num_tokens,
                            ")"));
  }
  const int64_t num_table_ids = static_cast<int64_t>(batch.block_table_ids.size());
  if (batch.block_table_start[0] != 0 || batch.block_table_start[num_tables] != num_table_ids) {
    return Malformed(StrCat("block_table_start runs from ", batch.block_table_start[0], " to ",
                            batch.block_table_start[num_tables], "; want 0 to ", num_table_ids));
  }
  for (int64_t row = 0; row < num_tables; ++row) {
    if (batch.block_table_start[row + 1] < batch.block_table_start[row]) {
      return Malformed(StrCat("block_table_start decreases at row ", row));
    }
  }
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int32_t id = batch.token_ids[t];
    if (id < 0 || id >= config.vocab_size) {
      return Malformed(StrCat("token ", t, " has id ", id, ", outside the vocabulary [0, ",
                              config.vocab_size, ")"));
    }
  }
  for (const PendingToken& pending : batch.pending_tokens) {
    if (pending.token < 0 || pending.token >= num_tokens || pending.launched_seq < 0) {
      return Malformed(StrCat("a pending token at index ", pending.token, " (of ", num_tokens,
                              ") from sequence ", pending.launched_seq));
    }
  }
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t query_len = int64_t{batch.query_start[i + 1]} - batch.query_start[i];
    const int64_t context_len = batch.context_lens[i];
    if (query_len < 1) {
      return Malformed(StrCat("sequence ", i, " has ", query_len, " new tokens (want >= 1)"));
    }
    if (query_len > context_len) {
      return Malformed(StrCat("sequence ", i, " has ", query_len,
                              " new tokens but a context of only ", context_len));
    }
    if (context_len > config.max_position_embeddings) {
      return Malformed(StrCat("sequence ", i, " has a context of ", context_len,
                              " tokens, beyond the model's ", config.max_position_embeddings));
    }
    for (int64_t g = 0; g < num_groups; ++g) {
      const int64_t row = i * num_groups + g;
      const int64_t begin = batch.block_table_start[row];
      const int64_t num_blocks = int64_t{batch.block_table_start[row + 1]} - begin;
      if (num_blocks * block_size_tokens < context_len) {
        return Malformed(StrCat("sequence ", i, " has ", num_blocks, " blocks of ",
                                block_size_tokens, " tokens for a context of ", context_len,
                                " (KV cache group ", g, ")"));
      }
      // Blocks wholly before the first key the first new token sees may be -1 in a window.
      const int64_t window = windows[static_cast<size_t>(g)];
      const int64_t first_key = context_len - query_len - window + 1;
      const int64_t num_droppable = window > 0 && first_key > 0 ? first_key / block_size_tokens : 0;
      for (int64_t j = 0; j < num_blocks; ++j) {
        const int32_t block = batch.block_table_ids[begin + j];
        if (block == -1 && j < num_droppable) continue;
        if (block < 0 || block >= num_kv_blocks) {
          return Malformed(StrCat("sequence ", i, " names block ", block, " at entry ", j,
                                  " of KV cache group ", g, ", outside the pool [0, ",
                                  num_kv_blocks, ")"));
        }
      }
    }
    const LogitsMode mode = batch.logits_modes[i];
    if (mode != LogitsMode::kNone && mode != LogitsMode::kLast && mode != LogitsMode::kAll &&
        mode != LogitsMode::kSample) {
      return Malformed(
          StrCat("sequence ", i, " has an unknown logits mode ", static_cast<int>(mode)));
    }
    if (mode == LogitsMode::kSample) {
      if (static_cast<int64_t>(batch.sampling.size()) != num_seqs) {
        return Malformed(StrCat("sequence ", i, " asks for sampling but sampling has ",
                                batch.sampling.size(), " entries for ", num_seqs, " sequences"));
      }
      const RunnerSampling& s = batch.sampling[i];
      if (!(s.temperature == s.temperature) || !(s.top_p == s.top_p) ||
          !(s.min_p == s.min_p)) {
        return Malformed(StrCat("sequence ", i, " has NaN sampling parameters"));
      }
      if (s.masked && static_cast<int64_t>(batch.token_bitmask.size()) !=
                          num_seqs * ((config.vocab_size + 31) / 32)) {
        return Malformed(StrCat("sequence ", i, " is masked but the token bitmask has ",
                                batch.token_bitmask.size(), " words"));
      }
    }
  }
  if (num_state_slots > 0) {
    if (static_cast<int64_t>(batch.state_slots.size()) != num_seqs) {
      return Malformed(StrCat(num_seqs, " sequences but ", batch.state_slots.size(),
                              " state slots"));
    }
    std::vector<bool> taken(static_cast<size_t>(num_state_slots), false);
    for (int64_t i = 0; i < num_seqs; ++i) {
      const int32_t slot = batch.state_slots[static_cast<size_t>(i)];
      if (slot < 0 || slot >= num_state_slots) {
        return Malformed(StrCat("sequence ", i, " names state slot ", slot, ", outside [0, ",
                                num_state_slots, ")"));
      }
      if (taken[static_cast<size_t>(slot)]) {
        return Malformed(StrCat("sequence ", i, " names state slot ", slot,
                                ", which an earlier sequence of the step holds"));
      }
      taken[static_cast<size_t>(slot)] = true;
    }
  }
  return absl::OkStatus();
}

int64_t StateSlotBytes(const ModelConfig& config) {
  if (config.ssm.num_heads <= 0) return 0;
  return NumSsmLayers(config) *
         (config.ssm.conv_state_floats() + config.ssm.ssm_state_floats()) *
         static_cast<int64_t>(sizeof(float));
}

KvCacheGroups KvCacheGroupsFor(const ModelConfig& config) {
  absl::StatusOr<std::unique_ptr<ModelDescription>> model = DescribeModel(config);
  if (!model.ok()) {
    return PlanKvCacheGroups(
        std::vector<int32_t>(static_cast<size_t>(std::max<int64_t>(config.num_layers, 1)), 0));
  }
  return PlanKvCacheGroups((*model)->kv_windows());
}

int64_t KvLayersPerBlock(const ModelConfig& config) {
  return KvCacheGroupsFor(config).layers_per_block;
}

absl::Status CheckLayerWindow(const AttentionLayer& layer, const KvCacheGroups& groups) {
  const int32_t group_window =
      groups.windows[static_cast<size_t>(groups.layer_group[static_cast<size_t>(layer.layer)])];
  if (group_window > 0 && (layer.window <= 0 || layer.window > group_window)) {
    return absl::InternalError(StrCat("layer ", layer.layer, " attends with window ", layer.window,
                                      " but its KV cache keeps ", group_window,
                                      " positions (ModelDescription::kv_windows)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelRunner>> ModelRunner::Create(const Checkpoint& checkpoint,
                                                                 const RunnerConfig& config) {
  if (config.max_context_len < 0) {
    return absl::InvalidArgumentError(
        StrCat("runner config: max_context_len (", config.max_context_len, ") is negative"));
  }
  ModelConfig model_config = checkpoint.config();
  if (config.max_context_len > 0) {
    model_config.max_position_embeddings =
        std::min(model_config.max_position_embeddings, config.max_context_len);
  }
  if (config.tensor_parallel_size != 1) {
    return CreateTensorParallelRunner(model_config, checkpoint, config);
  }
  LMSERVE_ASSIGN_OR_RETURN(std::unique_ptr<ModelDescription> model, DescribeModel(model_config));
  // The runners plan their memory before allocating (memory_plan.h); an allocation that fails
  // anyway (the plan is a floor; other processes take memory meanwhile) is caught here, the load
  // boundary, rather than ending the process.
  try {
    switch (config.backend) {
      case Backend::kCpu:
        return CreateCpuRunner(std::move(model), checkpoint, config);
      case Backend::kCuda:
#ifdef LMSERVE_HAVE_CUDA_RUNNER
        return CreateCudaRunner(std::move(model), checkpoint, config);
#else
        return absl::UnimplementedError(
            "this lmserve was built without CUDA (LMSERVE_CUDA=OFF or no nvcc): use the CPU "
            "backend");
#endif
    }
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        StrCat("out of host memory while loading the model (", model_config.architecture_name,
               ", hidden size ", model_config.hidden_size, ", ", model_config.num_layers,
               " layers, vocabulary ", model_config.vocab_size, ")"));
  }
  return absl::InvalidArgumentError(
      StrCat("unknown runner backend ", static_cast<int>(config.backend)));
}

int64_t CudaKvBlockBytes(const ModelConfig& config, int32_t block_size_tokens, RunnerDType dtype,
                         KvCacheDType kv_dtype) {
  const int64_t element_bytes = kv_dtype == KvCacheDType::kFp8
                                    ? 1
                                    : RunnerDTypeBytes(ResolveRunnerDType(dtype, Backend::kCuda));
  return 2 * KvLayersPerBlock(config) * int64_t{block_size_tokens} * config.num_kv_heads *
         config.head_dim * element_bytes;
}

std::string_view KvCacheDTypeName(KvCacheDType dtype) {
  switch (dtype) {
    case KvCacheDType::kAuto:
      return "auto";
    case KvCacheDType::kBFloat16:
      return "bf16";
    case KvCacheDType::kFp8:
      return "fp8";
  }
  return "unknown";
}

std::optional<KvCacheDType> KvCacheDTypeFromName(std::string_view name) {
  if (name == "bfloat16") return KvCacheDType::kBFloat16;
  if (name == "fp8_e4m3") return KvCacheDType::kFp8;
  for (KvCacheDType d : {KvCacheDType::kAuto, KvCacheDType::kBFloat16, KvCacheDType::kFp8}) {
    if (KvCacheDTypeName(d) == name) return d;
  }
  return std::nullopt;
}

int64_t CudaStateSlotBytes(const ModelConfig& config) {
  if (config.ssm.num_heads <= 0) return 0;
  const SsmConfig& ssm = config.ssm;
  // The conv state is a ring of conv_kernel rows (kernels/cuda/ssm.h).
  return NumSsmLayers(config) * (ssm.conv_kernel * ssm.conv_dim() + ssm.ssm_state_floats()) *
         int64_t{sizeof(float)};
}

std::vector<int32_t> CudaGraphBatchSizes(int32_t max_num_seqs) {
  std::vector<int32_t> sizes;
  for (int32_t b : {1, 2, 4}) {
    if (b < max_num_seqs) sizes.push_back(b);
  }
  for (int32_t b = 8; b < max_num_seqs; b += 8) sizes.push_back(b);
  sizes.push_back(max_num_seqs);
  return sizes;
}

std::string_view DecodeGemmName(DecodeGemm choice) {
  switch (choice) {
    case DecodeGemm::kAuto:
      return "auto";
    case DecodeGemm::kBlas:
      return "blas";
    case DecodeGemm::kSkinny:
      return "skinny";
  }
  return "unknown";
}

std::optional<DecodeGemm> DecodeGemmFromName(std::string_view name) {
  for (DecodeGemm choice : {DecodeGemm::kAuto, DecodeGemm::kBlas, DecodeGemm::kSkinny}) {
    if (DecodeGemmName(choice) == name) return choice;
  }
  return std::nullopt;
}

std::string_view RunnerQuantizationName(RunnerQuantization quantization) {
  switch (quantization) {
    case RunnerQuantization::kAuto:
      return "auto";
    case RunnerQuantization::kNone:
      return "none";
    case RunnerQuantization::kFp8:
      return "fp8";
    case RunnerQuantization::kGguf:
      return "gguf";
    case RunnerQuantization::kQ8_0:
      return "q8_0";
    case RunnerQuantization::kQ4_0:
      return "q4_0";
    case RunnerQuantization::kQ4_K:
      return "q4_k";
    case RunnerQuantization::kQ6_K:
      return "q6_k";
  }
  return "unknown";
}

std::optional<kernels::DType> RunnerQuantizationBlockType(RunnerQuantization quantization) {
  switch (quantization) {
    case RunnerQuantization::kQ8_0:
      return kernels::DType::kQ8_0;
    case RunnerQuantization::kQ4_0:
      return kernels::DType::kQ4_0;
    case RunnerQuantization::kQ4_K:
      return kernels::DType::kQ4_K;
    case RunnerQuantization::kQ6_K:
      return kernels::DType::kQ6_K;
    default:
      return std::nullopt;
  }
}

std::optional<RunnerQuantization> RunnerQuantizationFromName(std::string_view name) {
  for (RunnerQuantization q :
       {RunnerQuantization::kAuto, RunnerQuantization::kNone, RunnerQuantization::kFp8,
        RunnerQuantization::kGguf, RunnerQuantization::kQ8_0, RunnerQuantization::kQ4_0,
        RunnerQuantization::kQ4_K, RunnerQuantization::kQ6_K}) {
    if (RunnerQuantizationName(q) == name) return q;
  }
  return std::nullopt;
}

std::string_view CudaKernelPathName(CudaKernelPath path) {
  switch (path) {
    case CudaKernelPath::kAuto:
      return "auto";
    case CudaKernelPath::kPortable:
      return "portable";
  }
  return "unknown";
}

std::optional<CudaKernelPath> CudaKernelPathFromName(std::string_view name) {
  for (CudaKernelPath path : {CudaKernelPath::kAuto, CudaKernelPath::kPortable}) {
    if (CudaKernelPathName(path) == name) return path;
  }
  return std::nullopt;
}

std::string_view BackendName(Backend backend) {
  return backend == Backend::kCuda ? "cuda" : "cpu";
}

std::optional<Backend> BackendFromName(std::string_view name) {
  for (Backend backend : {Backend::kCpu, Backend::kCuda}) {
    if (BackendName(backend) == name) return backend;
  }
  return std::nullopt;
}

absl::Status CheckCudaDevice(int32_t device) {
#ifdef LMSERVE_HAVE_CUDA_RUNNER
  return CheckCudaRunnerDevice(device);
#else
  return absl::UnimplementedError(
      "this lmserve was built without CUDA (LMSERVE_CUDA=OFF or no nvcc)");
#endif
}

BackendChoice ChooseAutoBackend(int32_t device) {
  const absl::Status cuda = CheckCudaDevice(device);
  if (cuda.ok()) {
    return {Backend::kCuda, StrCat("CUDA device ", device, " is supported by this build")};
  }
  return {Backend::kCpu, std::string(cuda.message())};
}

}  // namespace lmserve::engine
