#include "engine/runner/cuda_runner.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "common/strings.h"
#include "engine/runner/dummy_weights.h"
#include "kernels/cpu/dequant.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/qkv_postprocess.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/decode_attention.h"
#include "kernels/cuda/dequant.h"
#include "kernels/cuda/dispatch.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/paged_attention_f32.h"
#include "kernels/cuda/prefill_attention.h"
#include "kernels/cuda/qkv_postprocess.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/skinny_gemm.h"

namespace lmserve::engine {
namespace {

namespace kc = kernels::cuda;
using kernels::DType;

constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;
// Logits rows computed at once (more rows, as teacher-forced scoring asks, go in chunks).
constexpr int64_t kMinLogitsChunkRows = 256;
// GPU memory kept free beyond the weights, workspaces and KV pool: CUDA graphs, cuBLAS's own
// allocations, the CUDA context's growth.
constexpr int64_t kReserveBytes = int64_t{512} << 20;

absl::Status CudaError(cudaError_t error, std::string_view what) {
  return absl::InternalError(StrCat("CUDA runner: ", what, ": ", cudaGetErrorString(error)));
}

#define LMSERVE_CUDA_RETURN(expr, what)                              \
  do {                                                               \
    if (const cudaError_t err_ = (expr); err_ != cudaSuccess) {      \
      return CudaError(err_, what);                                  \
    }                                                                \
  } while (0)

#define LMSERVE_BLAS_RETURN(expr, what)                                                   \
  do {                                                                                    \
    if (const cublasStatus_t st_ = (expr); st_ != CUBLAS_STATUS_SUCCESS) {                \
      return absl::InternalError(StrCat("CUDA runner: ", what, ": cuBLAS status ",        \
                                        static_cast<int>(st_)));                          \
    }                                                                                     \
  } while (0)

#define LMSERVE_STATUS_RETURN(expr)            \
  do {                                         \
    if (absl::Status st_ = (expr); !st_.ok()) { \
      return st_;                              \
    }                                          \
  } while (0)

// An owned cudaMalloc allocation.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  ~DeviceMemory() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  absl::Status Allocate(int64_t bytes, std::string_view what) {
    bytes_ = std::max<int64_t>(bytes, 16);
    if (const cudaError_t e = cudaMalloc(&ptr_, static_cast<size_t>(bytes_)); e != cudaSuccess) {
      cudaGetLastError();
      ptr_ = nullptr;
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      return absl::ResourceExhaustedError(StrCat("CUDA runner: cannot allocate ", bytes_,
                                                 " bytes for ", what, " (", free_bytes,
                                                 " of ", total_bytes, " bytes free)"));
    }
    return absl::OkStatus();
  }
  void* get() const { return ptr_; }
  int64_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  int64_t bytes_ = 0;
};

// An owned cudaMallocHost (pinned) allocation.
class PinnedMemory {
 public:
  PinnedMemory() = default;
  ~PinnedMemory() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
  }
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;

  absl::Status Allocate(int64_t bytes, std::string_view what) {
    if (const cudaError_t e = cudaMallocHost(&ptr_, static_cast<size_t>(std::max<int64_t>(bytes, 16)));
        e != cudaSuccess) {
      ptr_ = nullptr;
      return CudaError(e, StrCat("pinned memory for ", what));
    }
    return absl::OkStatus();
  }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

// Where each input array of a step lies in the packed input buffer (host and device alike). The
// offsets depend only on the counts, so a CUDA graph captured for a decode bucket finds its inputs
// at the same addresses on every replay; the block table ids, whose count varies, come last.
struct StepLayout {
  size_t slots = 0;             // int64 [tokens]
  size_t seeds = 0;             // uint64 [rows]
  size_t steps = 0;             // uint64 [rows]
  size_t token_ids = 0;         // int32 [tokens]
  size_t positions = 0;         // int32 [tokens]
  size_t query_start = 0;       // int32 [seqs + 1]
  size_t context_lens = 0;      // int32 [seqs]
  size_t block_table_start = 0; // int32 [seqs + 1]
  size_t logits_rows = 0;       // int32 [rows]: the token of each logits row
  size_t temperature = 0;       // float [rows]
  size_t top_k = 0;             // int32 [rows]
  size_t top_p = 0;             // float [rows]
  size_t min_p = 0;             // float [rows]
  size_t block_table_ids = 0;   // int32 [table ids]
  size_t total = 0;

  static StepLayout For(int64_t tokens, int64_t seqs, int64_t rows, int64_t table_ids) {
    StepLayout l;
    size_t offset = 0;
    auto take = [&offset](int64_t bytes) {
      const size_t at = offset;
      offset = (offset + static_cast<size_t>(bytes) + 15) / 16 * 16;
      return at;
    };
    l.slots = take(8 * tokens);
    l.seeds = take(8 * rows);
    l.steps = take(8 * rows);
    l.token_ids = take(4 * tokens);
    l.positions = take(4 * tokens);
    l.query_start = take(4 * (seqs + 1));
    l.context_lens = take(4 * seqs);
    l.block_table_start = take(4 * (seqs + 1));
    l.logits_rows = take(4 * rows);
    l.temperature = take(4 * rows);
    l.top_k = take(4 * rows);
    l.top_p = take(4 * rows);
    l.min_p = take(4 * rows);
    l.block_table_ids = take(4 * table_ids);
    l.total = offset;
    return l;
  }
};

// Device pointers of one layer's weights (in the runner's dtype).
struct LayerWeights {
  void* input_norm = nullptr;
  void* qkv = nullptr;       // [q_dim + 2 kv_dim, hidden]
  void* qkv_bias = nullptr;  // [q_dim + 2 kv_dim] or null
  void* o_proj = nullptr;    // [hidden, q_dim]
  void* post_norm = nullptr;
  void* gate_up = nullptr;   // [2 intermediate, hidden]
  void* down = nullptr;      // [hidden, intermediate]
};

enum Projection { kQkv, kOut, kGateUp, kDown, kLmHead, kNumProjections };

class CudaRunner final : public ModelRunner {
 public:
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(const Checkpoint& checkpoint,
                                                             const RunnerConfig& config);
  ~CudaRunner() override;

  const ModelConfig& model_config() const override { return config_; }
  Backend backend() const override { return Backend::kCuda; }
  int32_t block_size_tokens() const override { return block_size_; }
  int32_t num_kv_blocks() const override { return num_blocks_; }
  bool samples_on_device() const override { return true; }
  RunnerStats stats() const override;

  absl::Status Execute(const StepBatch& batch, StepOutput* output) override;

 private:
  CudaRunner(const ModelConfig& config, const RunnerConfig& runner_config);

  absl::Status Init(const Checkpoint& checkpoint);
  absl::Status LoadWeights(const Checkpoint& checkpoint);
  // Converts tensor `name` (of `shape`) into the runner's dtype at dst, or fills it with dummy
  // values.
  absl::Status LoadTensor(const Checkpoint& checkpoint, const std::string& name,
                          const std::vector<int64_t>& shape, int64_t fan_in, void* dst);
  absl::Status AllocateWorkspaces();
  // W's shape [n, k] of `projection`.
  std::pair<int64_t, int64_t> ProjectionShape(Projection projection) const;
  absl::Status CaptureGraphs();

  // Fills the pinned input buffer for `batch` (padded to `padded_seqs` decode sequences when a
  // graph runs it) and returns the layout used. Also fills the host-side row bookkeeping.
  StepLayout PackInputs(const StepBatch& batch, int64_t padded_seqs, bool decode_only);
  // The forward pass and the sampler for a step of `tokens` tokens, `seqs` sequences and `rows`
  // logits rows, reading its inputs through `layout` (already on the device).
  absl::Status Forward(const StepLayout& layout, int64_t tokens, int64_t seqs, int64_t rows,
                       bool decode_only, bool rows_are_tokens);
  // The sampler over rows [first_row, first_row + num_rows), whose logits are in logits_; the
  // tokens go to h_sampled_[first_row ...] when the stream gets there.
  absl::Status SampleRows(const StepLayout& layout, int64_t first_row, int64_t num_rows);
  // Attention over `layer`'s cache for the `seqs` sequences of the step in `layout`: the fields
  // that DecodeAttentionParams, PrefillAttentionParams and PagedAttentionF32Params (the float32
  // mode's) share.
  template <typename Params>
  Params PagedAttentionParams(const StepLayout& layout, int64_t layer, int64_t seqs) const;
  // The same with the ragged batch's query starts and `tokens`, which the prefill and the float32
  // kernels take.
  template <typename Params>
  Params RaggedAttentionParams(const StepLayout& layout, int64_t layer, int64_t tokens,
                               int64_t seqs) const;
  // Prefill attention over `layer`'s cache for the step in `layout` (the plan and every layer's
  // launch share it).
  kc::PrefillAttentionParams PrefillParams(const StepLayout& layout, int64_t layer, int64_t tokens,
                                           int64_t seqs) const;
  // residual_ += projected_, then normed_ = RMSNorm(residual_) with `weight`, for `tokens` rows.
  absl::Status AddNorm(const void* weight, int64_t tokens, const char* what);
  absl::Status RunLayer(int64_t layer, const StepLayout& layout, int64_t tokens, int64_t seqs,
                        bool decode_only);
  absl::StatusOr<const kc::GemmPlan*> Plan(Projection projection, int64_t m, bool autotune);
  // y = x W^T with `layer`'s weights of `projection` (the LM head: any layer), through cuBLASLt
  // or the skinny kernel (ChooseKernel); with `act` (kGateUp only), `act` gets silu(gate) * up:
  // the skinny kernel's epilogue, or a SiLU-and-mul kernel after cuBLASLt writes y.
  absl::Status Gemm(Projection projection, int64_t layer, int64_t m, const void* x, void* y,
                    void* act = nullptr);
  enum class GemmKernel { kBlas, kSkinny };
  // The faster of cuBLASLt and the skinny GEMM for this projection at m rows: timed on first
  // use (never while a graph is being captured: the graphs' sizes are decided in their warm-up),
  // over every layer's weights in turn, so that they come from memory as in a step.
  // $LMSERVE_DECODE_GEMM=blas|skinny forces one where it applies (benchmarks).
  absl::StatusOr<GemmKernel> ChooseKernel(Projection projection, const kc::GemmPlan& plan,
                                          const void* x, void* y, void* act);
  // The weights of `projection` in `layer` (the LM head has one, whatever the layer).
  const void* ProjectionWeights(Projection projection, int64_t layer) const;

  template <typename T>
  const T* In(size_t offset) const {
    return reinterpret_cast<const T*>(d_inputs_.as<unsigned char>() + offset);
  }
  template <typename T>
  T* HostIn(size_t offset) const {
    return reinterpret_cast<T*>(h_inputs_.as<unsigned char>() + offset);
  }
  void* KeyCache(int64_t layer) const {
    return kv_pool_.as<unsigned char>() + (2 * layer) * layer_cache_bytes_;
  }
  void* ValueCache(int64_t layer) const {
    return kv_pool_.as<unsigned char>() + (2 * layer + 1) * layer_cache_bytes_;
  }

  const ModelConfig config_;
  const RunnerConfig runner_config_;
  const RunnerDType dtype_;      // resolved: kBFloat16 or kFloat32
  const DType kernel_dtype_;     // the kernels' name for it: kBF16 or kF32
  const int64_t element_bytes_;  // 2 or 4
  const int32_t block_size_;
  const int64_t q_dim_, kv_dim_, qkv_dim_;
  const float attention_scale_;  // 1 / sqrt(head_dim)
  const int64_t max_tokens_;  // tokens in a step, at most
  const int64_t max_seqs_;    // sequences in a step, at most
  int64_t max_table_ids_ = 0;
  int64_t logits_chunk_rows_ = 0;
  std::string device_name_;
  int64_t device_total_bytes_ = 0;

  cudaStream_t stream_ = nullptr;
  std::unique_ptr<kc::BlasLtHandle> blas_;
  DeviceMemory gemm_workspace_;
  std::map<std::pair<int, int64_t>, std::unique_ptr<kc::GemmPlan>> plans_;
  std::map<std::pair<int, int64_t>, GemmKernel> gemm_kernel_;

  // Weights.
  DeviceMemory weights_;
  void* embed_ = nullptr;
  void* final_norm_ = nullptr;
  void* lm_head_ = nullptr;
  std::vector<LayerWeights> layers_;
  DeviceMemory cos_sin_;  // [max_position, head_dim] fp32

  // KV pool.
  DeviceMemory kv_pool_;
  int32_t num_blocks_ = 0;
  int64_t layer_cache_bytes_ = 0;

  // Inputs, host (pinned) and device, StepLayout-packed.
  PinnedMemory h_inputs_;
  DeviceMemory d_inputs_;
  size_t inputs_capacity_ = 0;

  // Activations (in the runner's dtype) and outputs.
  DeviceMemory residual_, normed_, qkv_, attention_, projected_, gate_up_, activation_, rows_;
  DeviceMemory logits_;          // [logits_chunk_rows, vocab] fp32
  DeviceMemory sampled_;         // [max_tokens] int32
  DeviceMemory sampler_workspace_;  // kc::kSamplingWorkspaceBytes
  PinnedMemory h_sampled_;       // [max_tokens] int32
  DeviceMemory decode_workspace_;
  DeviceMemory prefill_workspace_;
  std::map<int64_t, int> decode_splits_;  // batch size -> DecodeAttentionParams max_splits

  // CUDA graphs of decode-only steps, by padded batch size.
  struct Graph {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
  };
  std::map<int64_t, Graph> graphs_;

  // Host bookkeeping of the current step.
  std::vector<int32_t> row_token_;   // device row -> token index
  std::vector<int32_t> row_seq_;     // device row -> sequence
  std::vector<bool> row_samples_;    // device row -> a kSample row
  std::vector<int64_t> row_output_;  // device row -> output logits row (-1 for kSample rows)

  int64_t weight_bytes_ = 0;
  double startup_seconds_ = 0;
};

int64_t Align256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

CudaRunner::CudaRunner(const ModelConfig& config, const RunnerConfig& runner_config)
    : config_(config),
      runner_config_(runner_config),
      dtype_(ResolveRunnerDType(runner_config.dtype, Backend::kCuda)),
      kernel_dtype_(dtype_ == RunnerDType::kFloat32 ? DType::kF32 : DType::kBF16),
      element_bytes_(RunnerDTypeBytes(dtype_)),
      block_size_(runner_config.block_size_tokens),
      q_dim_(config.num_attention_heads * config.head_dim),
      kv_dim_(config.num_kv_heads * config.head_dim),
      qkv_dim_(q_dim_ + 2 * kv_dim_),
      attention_scale_(static_cast<float>(1.0 / std::sqrt(static_cast<double>(config.head_dim)))),
      max_tokens_(std::max<int64_t>(runner_config.max_num_batched_tokens,
                                    runner_config.max_num_seqs)),
      max_seqs_(runner_config.max_num_seqs) {}

CudaRunner::~CudaRunner() {
  for (auto& [size, graph] : graphs_) {
    if (graph.exec != nullptr) cudaGraphExecDestroy(graph.exec);
    if (graph.graph != nullptr) cudaGraphDestroy(graph.graph);
  }
  plans_.clear();
  blas_.reset();
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::StatusOr<std::unique_ptr<ModelRunner>> CudaRunner::Create(const Checkpoint& checkpoint,
                                                                const RunnerConfig& config) {
  const auto start = std::chrono::steady_clock::now();
  const ModelConfig& model = checkpoint.config();
  LMSERVE_STATUS_RETURN(ValidateModelConfig(model));
  if (config.block_size_tokens <= 0 || config.kv_cache_bytes < 0 || config.max_num_seqs <= 0 ||
      config.max_num_batched_tokens <= 0 || !(config.gpu_memory_utilization > 0.0) ||
      config.gpu_memory_utilization > 1.0) {
    return absl::InvalidArgumentError(StrCat(
        "runner config: block_size_tokens (", config.block_size_tokens, "), max_num_seqs (",
        config.max_num_seqs, ") and max_num_batched_tokens (", config.max_num_batched_tokens,
        ") must be positive, kv_cache_bytes (", config.kv_cache_bytes,
        ") non-negative and gpu_memory_utilization (", config.gpu_memory_utilization,
        ") in (0, 1]"));
  }
  const RunnerDType dtype = ResolveRunnerDType(config.dtype, Backend::kCuda);
  if (dtype != RunnerDType::kBFloat16 && dtype != RunnerDType::kFloat32) {
    return absl::InvalidArgumentError(StrCat("runner config: unknown dtype ",
                                             static_cast<int>(config.dtype)));
  }
  LMSERVE_STATUS_RETURN(CheckCudaRunnerDevice(config.device));
  cudaDeviceProp prop{};
  LMSERVE_CUDA_RETURN(cudaGetDeviceProperties(&prop, config.device), "cudaGetDeviceProperties");
  if (!kc::SupportsHeadDim(model.head_dim)) {
    return absl::UnimplementedError(StrCat("CUDA runner: head_dim ", model.head_dim,
                                           " is not supported (", kc::kHeadDimList, ")"));
  }
  if (model.hidden_size % 8 != 0 || model.intermediate_size % 8 != 0 ||
      model.vocab_size % 8 != 0) {
    return absl::UnimplementedError(
        StrCat("CUDA runner: hidden (", model.hidden_size, "), intermediate (",
               model.intermediate_size, ") and vocabulary (", model.vocab_size,
               ") sizes must be multiples of 8"));
  }
  LMSERVE_CUDA_RETURN(cudaSetDevice(config.device), "cudaSetDevice");
  std::unique_ptr<CudaRunner> runner(new CudaRunner(model, config));
  runner->device_name_ = prop.name;
  runner->device_total_bytes_ = static_cast<int64_t>(prop.totalGlobalMem);
  LMSERVE_STATUS_RETURN(runner->Init(checkpoint));
  runner->startup_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

absl::Status CudaRunner::Init(const Checkpoint& checkpoint) {
  LMSERVE_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                      "cudaStreamCreate");
  absl::StatusOr<std::unique_ptr<kc::BlasLtHandle>> blas = kc::BlasLtHandle::Create();
  if (!blas.ok()) return blas.status();
  blas_ = *std::move(blas);
  LMSERVE_STATUS_RETURN(gemm_workspace_.Allocate(kGemmWorkspaceBytes, "the GEMM workspace"));
  LMSERVE_STATUS_RETURN(LoadWeights(checkpoint));
  LMSERVE_STATUS_RETURN(AllocateWorkspaces());

  // The KV pool: what the memory budget leaves, or what the caller fixed.
  const int64_t block_bytes = CudaKvBlockBytes(config_, block_size_, dtype_);
  int64_t kv_bytes = runner_config_.kv_cache_bytes;
  size_t free_bytes = 0, total_bytes = 0;
  LMSERVE_CUDA_RETURN(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const int64_t budget =
      static_cast<int64_t>(free_bytes) -
      static_cast<int64_t>((1.0 - runner_config_.gpu_memory_utilization) *
                           static_cast<double>(total_bytes)) -
      kReserveBytes;
  if (kv_bytes == 0) kv_bytes = budget;
  if (kv_bytes < block_bytes) {
    return absl::ResourceExhaustedError(StrCat(
        "CUDA runner: no room for the KV cache: ", budget >> 20, " MiB left of ",
        total_bytes >> 20, " MiB at gpu_memory_utilization ",
        runner_config_.gpu_memory_utilization, " after ", weight_bytes_ >> 20,
        " MiB of weights; one block takes ", block_bytes, " bytes"));
  }
  num_blocks_ = static_cast<int32_t>(
      std::min<int64_t>(kv_bytes / block_bytes, std::numeric_limits<int32_t>::max()));
  layer_cache_bytes_ = int64_t{num_blocks_} * block_size_ * kv_dim_ * element_bytes_;
  LMSERVE_STATUS_RETURN(kv_pool_.Allocate(2 * config_.num_layers * layer_cache_bytes_,
                                          "the KV cache"));
  // Zeros: a padded or stale slot never holds NaNs that a masked-out read could spread.
  LMSERVE_CUDA_RETURN(cudaMemsetAsync(kv_pool_.get(), 0, kv_pool_.bytes(), stream_),
                      "zeroing the KV cache");
  LMSERVE_CUDA_RETURN(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  if (runner_config_.cuda_graphs) LMSERVE_STATUS_RETURN(CaptureGraphs());
  return absl::OkStatus();
}

absl::Status CudaRunner::LoadTensor(const Checkpoint& checkpoint, const std::string& name,
                                    const std::vector<int64_t>& shape, int64_t fan_in, void* dst) {
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  if (runner_config_.load_format == LoadFormat::kDummy) {
    const DummyRange range = DummyWeightRange(name, fan_in);
    kc::RandomFillParams fill{.output = dst,
                              .num_elements = elements,
                              .low = range.low,
                              .high = range.high,
                              .seed = DummyTensorSeed(name),
                              .dtype = kernel_dtype_};
    LMSERVE_CUDA_RETURN(kc::Launch(fill, stream_), StrCat("dummy values of ", name));
    return absl::OkStatus();
  }
  absl::StatusOr<const TensorView*> tensor = checkpoint.Get(name, shape);
  if (!tensor.ok()) return tensor.status();
  const TensorView& t = **tensor;
  if (absl::Status s = CheckTensorBytes(t); !s.ok()) return s;
  if (t.dtype == kernel_dtype_) {  // already in the runner's dtype: copy as is
    LMSERVE_CUDA_RETURN(cudaMemcpyAsync(dst, t.data, static_cast<size_t>(t.num_bytes),
                                        cudaMemcpyHostToDevice, stream_),
                        StrCat("uploading ", name));
    LMSERVE_CUDA_RETURN(cudaStreamSynchronize(stream_), StrCat("uploading ", name));
    return absl::OkStatus();
  }
  // Upload the file's bytes to a staging buffer and convert them on the GPU.
  DeviceMemory staging;
  LMSERVE_STATUS_RETURN(staging.Allocate(t.num_bytes, StrCat("staging ", name)));
  const kc::DequantizeParams convert{.src = staging.get(), .dst = dst, .num_elements = elements,
                                     .dtype = t.dtype, .output_dtype = kernel_dtype_};
  if (convert.Validate().ok()) {
    LMSERVE_CUDA_RETURN(cudaMemcpyAsync(staging.get(), t.data, static_cast<size_t>(t.num_bytes),
                                        cudaMemcpyHostToDevice, stream_),
                        StrCat("uploading ", name));
    LMSERVE_CUDA_RETURN(kc::Launch(convert, stream_), StrCat("converting ", name));
    LMSERVE_CUDA_RETURN(cudaStreamSynchronize(stream_), StrCat("converting ", name));
    return absl::OkStatus();
  }
  // Shapes the GPU converter does not take (a count off its block multiple): on the host.
  std::vector<float> f32(static_cast<size_t>(elements));
  kernels::DequantizeToF32(t.dtype, t.data, f32.data(), elements);
  std::vector<uint16_t> bf16;
  const void* host = f32.data();
  if (kernel_dtype_ == DType::kBF16) {
    bf16.resize(f32.size());
    for (size_t i = 0; i < f32.size(); ++i) bf16[i] = kernels::F32ToBf16(f32[i]);
    host = bf16.data();
  }
  LMSERVE_CUDA_RETURN(cudaMemcpyAsync(dst, host, static_cast<size_t>(elements * element_bytes_),
                                      cudaMemcpyHostToDevice, stream_),
                      StrCat("uploading ", name));
  LMSERVE_CUDA_RETURN(cudaStreamSynchronize(stream_), StrCat("uploading ", name));
  return absl::OkStatus();
}

absl::Status CudaRunner::LoadWeights(const Checkpoint& checkpoint) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size, vocab = c.vocab_size;
  // One allocation for every weight, each tensor 256-byte aligned.
  int64_t total = 0;
  auto reserve = [&total, this](int64_t elements) {
    const int64_t at = total;
    total += Align256(elements * element_bytes_);
    return at;
  };
  const int64_t embed_at = reserve(vocab * hidden);
  const int64_t norm_at = reserve(hidden);
  const int64_t lm_head_at = c.tie_word_embeddings ? -1 : reserve(vocab * hidden);
  struct LayerOffsets {
    int64_t input_norm, qkv, qkv_bias, o_proj, post_norm, gate_up, down;
  };
  std::vector<LayerOffsets> offsets(static_cast<size_t>(c.num_layers));
  for (LayerOffsets& o : offsets) {
    o.input_norm = reserve(hidden);
    o.qkv = reserve(qkv_dim_ * hidden);
    o.qkv_bias = c.attention_bias ? reserve(qkv_dim_) : -1;
    o.o_proj = reserve(hidden * q_dim_);
    o.post_norm = reserve(hidden);
    o.gate_up = reserve(2 * inter * hidden);
    o.down = reserve(hidden * inter);
  }
  LMSERVE_STATUS_RETURN(weights_.Allocate(total, "the weights"));
  weight_bytes_ = total;
  unsigned char* base = weights_.as<unsigned char>();
  auto at = [base](int64_t offset) -> void* { return offset < 0 ? nullptr : base + offset; };

  embed_ = at(embed_at);
  final_norm_ = at(norm_at);
  LMSERVE_STATUS_RETURN(
      LoadTensor(checkpoint, "model.embed_tokens.weight", {vocab, hidden}, hidden, embed_));
  LMSERVE_STATUS_RETURN(LoadTensor(checkpoint, "model.norm.weight", {hidden}, hidden, final_norm_));
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    lm_head_ = at(lm_head_at);
    LMSERVE_STATUS_RETURN(
        LoadTensor(checkpoint, "lm_head.weight", {vocab, hidden}, hidden, lm_head_));
  }
  layers_.resize(offsets.size());
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerOffsets& o = offsets[l];
    LayerWeights& w = layers_[l];
    w = {at(o.input_norm), at(o.qkv), at(o.qkv_bias), at(o.o_proj), at(o.post_norm),
         at(o.gate_up), at(o.down)};
    auto name = [l](const char* suffix) { return LayerTensorName(l, suffix); };
    auto rows = [this](void* matrix, int64_t first_row, int64_t width) {
      return static_cast<void*>(static_cast<unsigned char*>(matrix) +
                                first_row * width * element_bytes_);
    };
    LMSERVE_STATUS_RETURN(
        LoadTensor(checkpoint, name("input_layernorm.weight"), {hidden}, hidden, w.input_norm));
    LMSERVE_STATUS_RETURN(LoadTensor(checkpoint, name("post_attention_layernorm.weight"),
                                     {hidden}, hidden, w.post_norm));
    LMSERVE_STATUS_RETURN(LoadTensor(checkpoint, name("self_attn.o_proj.weight"),
                                     {hidden, q_dim_}, q_dim_, w.o_proj));
    LMSERVE_STATUS_RETURN(
        LoadTensor(checkpoint, name("mlp.down_proj.weight"), {hidden, inter}, inter, w.down));
    // Fused rows: q, k, v (and their biases); gate, then up.
    const struct {
      const char* suffix;
      int64_t rows, first_row;
    } parts[] = {{"self_attn.q_proj", q_dim_, 0},
                 {"self_attn.k_proj", kv_dim_, q_dim_},
                 {"self_attn.v_proj", kv_dim_, q_dim_ + kv_dim_}};
    for (const auto& part : parts) {
      LMSERVE_STATUS_RETURN(LoadTensor(checkpoint, StrCat(name(part.suffix), ".weight"),
                                       {part.rows, hidden}, hidden,
                                       rows(w.qkv, part.first_row, hidden)));
      if (c.attention_bias) {
        LMSERVE_STATUS_RETURN(LoadTensor(checkpoint, StrCat(name(part.suffix), ".bias"),
                                         {part.rows}, hidden, rows(w.qkv_bias, part.first_row, 1)));
      }
    }
    LMSERVE_STATUS_RETURN(LoadTensor(checkpoint, name("mlp.gate_proj.weight"), {inter, hidden},
                                     hidden, w.gate_up));
    LMSERVE_STATUS_RETURN(LoadTensor(checkpoint, name("mlp.up_proj.weight"), {inter, hidden},
                                     hidden, rows(w.gate_up, inter, hidden)));
  }

  // The rotary table, fp32, for every position the model takes.
  const std::vector<double> inv_freq = RopeInverseFrequencies(c);
  const std::vector<float> table =
      kernels::RotaryCosSinTable(inv_freq.data(), c.head_dim, c.max_position_embeddings);
  LMSERVE_STATUS_RETURN(
      cos_sin_.Allocate(static_cast<int64_t>(table.size() * sizeof(float)), "the rotary table"));
  LMSERVE_CUDA_RETURN(cudaMemcpyAsync(cos_sin_.get(), table.data(), table.size() * sizeof(float),
                                      cudaMemcpyHostToDevice, stream_),
                      "uploading the rotary table");
  LMSERVE_CUDA_RETURN(cudaStreamSynchronize(stream_), "loading the weights");
  return absl::OkStatus();
}

absl::Status CudaRunner::AllocateWorkspaces() {
  const ModelConfig& c = config_;
  const int64_t t = max_tokens_;
  const int64_t e = element_bytes_;
  const int64_t hidden_bytes = t * c.hidden_size * e;
  LMSERVE_STATUS_RETURN(residual_.Allocate(hidden_bytes, "activations"));
  LMSERVE_STATUS_RETURN(normed_.Allocate(hidden_bytes, "activations"));
  LMSERVE_STATUS_RETURN(projected_.Allocate(hidden_bytes, "activations"));
  LMSERVE_STATUS_RETURN(rows_.Allocate(hidden_bytes, "activations"));
  LMSERVE_STATUS_RETURN(qkv_.Allocate(t * qkv_dim_ * e, "activations"));
  LMSERVE_STATUS_RETURN(attention_.Allocate(t * q_dim_ * e, "activations"));
  LMSERVE_STATUS_RETURN(gate_up_.Allocate(t * 2 * c.intermediate_size * e, "activations"));
  LMSERVE_STATUS_RETURN(activation_.Allocate(t * c.intermediate_size * e, "activations"));
  logits_chunk_rows_ = std::max<int64_t>(max_seqs_, kMinLogitsChunkRows);
  logits_chunk_rows_ = std::min<int64_t>(logits_chunk_rows_, t);
  LMSERVE_STATUS_RETURN(
      logits_.Allocate(logits_chunk_rows_ * c.vocab_size * int64_t{sizeof(float)}, "logits"));
  LMSERVE_STATUS_RETURN(sampled_.Allocate(t * 4, "sampled tokens"));
  LMSERVE_STATUS_RETURN(sampler_workspace_.Allocate(kc::kSamplingWorkspaceBytes, "the sampler"));
  LMSERVE_CUDA_RETURN(cudaMemset(sampler_workspace_.get(), 0, kc::kSamplingWorkspaceBytes),
                      "clearing the sampler's workspace");
  LMSERVE_STATUS_RETURN(h_sampled_.Allocate(t * 4, "sampled tokens"));

  // Inputs: every table at most ceil(max position / block size) blocks long.
  const int64_t blocks_per_seq = (c.max_position_embeddings + block_size_ - 1) / block_size_;
  max_table_ids_ = max_seqs_ * blocks_per_seq;
  inputs_capacity_ = StepLayout::For(t, max_seqs_, t, max_table_ids_).total;
  LMSERVE_STATUS_RETURN(h_inputs_.Allocate(static_cast<int64_t>(inputs_capacity_), "step inputs"));
  LMSERVE_STATUS_RETURN(d_inputs_.Allocate(static_cast<int64_t>(inputs_capacity_), "step inputs"));

  // Decode attention: the split cap of each batch size, and room for the largest partials
  // (bf16 only: in float32 every attention runs on PagedAttentionF32, which needs neither).
  int64_t decode_bytes = 16;
  for (int64_t b = 1; dtype_ == RunnerDType::kBFloat16 && b <= max_seqs_; ++b) {
    const int splits = kc::DecodeAttentionParams::ChooseMaxSplits(
        b, c.num_attention_heads, c.num_kv_heads, c.head_dim, DType::kBF16);
    decode_splits_[b] = splits;
    decode_bytes = std::max(decode_bytes, kc::DecodeAttentionParams::WorkspaceBytes(
                                              b, c.num_attention_heads, c.head_dim, splits));
  }
  LMSERVE_STATUS_RETURN(decode_workspace_.Allocate(decode_bytes, "decode attention"));
  LMSERVE_STATUS_RETURN(prefill_workspace_.Allocate(
      kc::PrefillAttentionParams::WorkspaceBytes(max_seqs_), "prefill attention"));
  return absl::OkStatus();
}

absl::StatusOr<const kc::GemmPlan*> CudaRunner::Plan(Projection projection, int64_t m,
                                                     bool autotune) {
  auto& slot = plans_[{projection, m}];
  if (slot != nullptr) return slot.get();
  kc::GemmShape shape{.m = m, .input_dtype = kernel_dtype_, .output_dtype = kernel_dtype_};
  std::tie(shape.n, shape.k) = ProjectionShape(projection);
  if (projection == kLmHead) shape.output_dtype = DType::kF32;
  absl::StatusOr<std::unique_ptr<kc::GemmPlan>> plan =
      kc::GemmPlan::Create(blas_->get(), shape, gemm_workspace_.get(), kGemmWorkspaceBytes,
                           autotune, stream_);
  if (!plan.ok()) return plan.status();
  slot = *std::move(plan);
  return slot.get();
}

std::pair<int64_t, int64_t> CudaRunner::ProjectionShape(Projection projection) const {
  const ModelConfig& c = config_;
  switch (projection) {
    case kQkv:
      return {qkv_dim_, c.hidden_size};
    case kOut:
      return {c.hidden_size, q_dim_};
    case kGateUp:
      return {2 * c.intermediate_size, c.hidden_size};
    case kDown:
      return {c.hidden_size, c.intermediate_size};
    default:
      return {c.vocab_size, c.hidden_size};
  }
}

kc::SkinnyGemmParams SkinnyParams(const kc::GemmShape& shape, const void* x, const void* w,
                                  void* y) {
  return {.x = x, .w = w, .y = y, .m = shape.m, .n = shape.n, .k = shape.k,
          .input_dtype = shape.input_dtype, .output_dtype = shape.output_dtype};
}

const void* CudaRunner::ProjectionWeights(Projection projection, int64_t layer) const {
  switch (projection) {
    case kQkv:
      return layers_[layer].qkv;
    case kOut:
      return layers_[layer].o_proj;
    case kGateUp:
      return layers_[layer].gate_up;
    case kDown:
      return layers_[layer].down;
    default:
      return lm_head_;
  }
}

absl::StatusOr<CudaRunner::GemmKernel> CudaRunner::ChooseKernel(Projection projection,
                                                                const kc::GemmPlan& plan,
                                                                const void* x, void* y,
                                                                void* act) {
  // The skinny kernel is bf16 only: float32 runs every GEMM through cuBLASLt.
  if (dtype_ != RunnerDType::kBFloat16) return GemmKernel::kBlas;
  const int64_t m = plan.shape().m;
  const auto key = std::make_pair(static_cast<int>(projection), m);
  if (auto it = gemm_kernel_.find(key); it != gemm_kernel_.end()) return it->second;
  kc::SkinnyGemmParams skinny = SkinnyParams(plan.shape(), x, ProjectionWeights(projection, 0),
                                             act != nullptr ? act : y);
  skinny.silu_and_mul = act != nullptr;
  const bool skinny_ok = m <= kc::kMaxSkinnyGemmRows && skinny.Validate().ok();
  const char* forced = std::getenv("LMSERVE_DECODE_GEMM");
  const std::string_view force = forced != nullptr ? forced : "auto";
  if (force == "blas" || !skinny_ok) return gemm_kernel_[key] = GemmKernel::kBlas;
  if (force == "skinny") return gemm_kernel_[key] = GemmKernel::kSkinny;
  // One row of a decoder layer: the skinny kernel, untimed. Timed alone, cuBLASLt's split-K
  // kernels for the down projection sometimes came out ahead on H200s, by as much as 5%; in the
  // step, where the skinny kernel overlaps its launch and first loads with the kernel before it,
  // they ran 1.5-3 us a layer slower every time (kernel timelines of lmserve-model-bench).
  if (m == 1 && projection != kLmHead) return gemm_kernel_[key] = GemmKernel::kSkinny;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  LMSERVE_CUDA_RETURN(cudaStreamIsCapturing(stream_, &capturing), "cudaStreamIsCapturing");
  if (capturing != cudaStreamCaptureStatusNone) return GemmKernel::kBlas;
  const int64_t num_weights = projection == kLmHead ? 1 : config_.num_layers;
  cudaEvent_t start = nullptr, stop = nullptr;
  LMSERVE_CUDA_RETURN(cudaEventCreate(&start), "cudaEventCreate");
  LMSERVE_CUDA_RETURN(cudaEventCreate(&stop), "cudaEventCreate");
  // The candidates, each a pass over every layer's weights.
  std::vector<std::pair<GemmKernel, std::function<void()>>> candidates;
  candidates.emplace_back(GemmKernel::kBlas, [&] {
    for (int64_t l = 0; l < num_weights; ++l) {
      plan.Run(x, ProjectionWeights(projection, l), y, stream_);
      if (act != nullptr) {
        kc::SiluAndMulParams silu{.gate_up = y, .output = act, .num_tokens = m,
                                  .intermediate_size = config_.intermediate_size};
        kc::Launch(silu, stream_);
      }
    }
  });
  candidates.emplace_back(GemmKernel::kSkinny, [&] {
    for (int64_t l = 0; l < num_weights; ++l) {
      skinny.w = ProjectionWeights(projection, l);
      kc::Launch(skinny, stream_);
    }
  });
  // Rounds that time every candidate in turn (after two warm-up rounds), so that a clock or
  // neighbour's change hits them alike; the median of 7 each. A single pass each, in order, once
  // let cuBLASLt win gate/up at one row on an H200 that ran it 8% slower in the step.
  std::vector<std::vector<float>> times(candidates.size());
  for (int round = 0; round < 9; ++round) {
    for (size_t i = 0; i < candidates.size(); ++i) {
      cudaEventRecord(start, stream_);
      candidates[i].second();
      cudaEventRecord(stop, stream_);
      cudaEventSynchronize(stop);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      if (round >= 2) times[i].push_back(ms);
    }
  }
  // The fastest median; a tie goes to the later candidate (the skinny kernel over cuBLASLt).
  GemmKernel best = candidates[0].first;
  float best_ms = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < candidates.size(); ++i) {
    std::sort(times[i].begin(), times[i].end());
    if (const float median = times[i][times[i].size() / 2]; median <= best_ms) {
      best = candidates[i].first, best_ms = median;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  LMSERVE_CUDA_RETURN(cudaGetLastError(), "timing the GEMMs");
  return gemm_kernel_[key] = best;
}

absl::Status CudaRunner::Gemm(Projection projection, int64_t layer, int64_t m, const void* x,
                              void* y, void* act) {
  absl::StatusOr<const kc::GemmPlan*> plan = Plan(projection, m, /*autotune=*/false);
  if (!plan.ok()) return plan.status();
  const void* w = ProjectionWeights(projection, layer);
  if (m <= kc::kMaxSkinnyGemmRows) {
    absl::StatusOr<GemmKernel> kernel = ChooseKernel(projection, **plan, x, y, act);
    if (!kernel.ok()) return kernel.status();
    if (*kernel == GemmKernel::kSkinny) {
      kc::SkinnyGemmParams params = SkinnyParams((*plan)->shape(), x, w, act != nullptr ? act : y);
      params.silu_and_mul = act != nullptr;
      // Gate/up is followed by the down projection, another stream of weights: that one may
      // launch only once gate/up has read its weights. The others are followed by short kernels.
      params.late_dependents = projection == kGateUp;
      LMSERVE_CUDA_RETURN(kc::Launch(params, stream_), "skinny GEMM");
      return absl::OkStatus();
    }
  }
  LMSERVE_BLAS_RETURN((*plan)->Run(x, w, y, stream_), "GEMM");
  if (act != nullptr) {
    kc::SiluAndMulParams silu{.gate_up = y, .output = act, .num_tokens = m,
                              .intermediate_size = config_.intermediate_size,
                              .dtype = kernel_dtype_};
    LMSERVE_CUDA_RETURN(kc::Launch(silu, stream_), "SiLU and mul");
  }
  return absl::OkStatus();
}

template <typename Params>
Params CudaRunner::PagedAttentionParams(const StepLayout& layout, int64_t layer,
                                        int64_t seqs) const {
  const ModelConfig& c = config_;
  return {.query = qkv_.get(),
          .key_cache = KeyCache(layer),
          .value_cache = ValueCache(layer),
          .context_lens = In<int32_t>(layout.context_lens),
          .block_table_start = In<int32_t>(layout.block_table_start),
          .block_table_ids = In<int32_t>(layout.block_table_ids),
          .output = attention_.get(),
          .num_seqs = seqs,
          .num_heads = c.num_attention_heads,
          .num_kv_heads = c.num_kv_heads,
          .head_dim = c.head_dim,
          .block_size = block_size_,
          .num_blocks = num_blocks_,
          .query_stride = qkv_dim_,
          .scale = attention_scale_,
          .dtype = kernel_dtype_};
}

template <typename Params>
Params CudaRunner::RaggedAttentionParams(const StepLayout& layout, int64_t layer, int64_t tokens,
                                         int64_t seqs) const {
  auto params = PagedAttentionParams<Params>(layout, layer, seqs);
  params.query_start = In<int32_t>(layout.query_start);
  params.num_tokens = tokens;
  return params;
}

kc::PrefillAttentionParams CudaRunner::PrefillParams(const StepLayout& layout, int64_t layer,
                                                     int64_t tokens, int64_t seqs) const {
  auto params = RaggedAttentionParams<kc::PrefillAttentionParams>(layout, layer, tokens, seqs);
  params.workspace = prefill_workspace_.get();
  return params;
}

absl::Status CudaRunner::AddNorm(const void* weight, int64_t tokens, const char* what) {
  kc::FusedAddRmsNormParams norm{.residual = residual_.get(), .input = projected_.get(),
                                 .weight = weight, .output = normed_.get(),
                                 .num_tokens = tokens, .hidden_size = config_.hidden_size,
                                 .epsilon = static_cast<float>(config_.rms_norm_eps),
                                 .dtype = kernel_dtype_};
  LMSERVE_CUDA_RETURN(kc::Launch(norm, stream_), what);
  return absl::OkStatus();
}

absl::Status CudaRunner::RunLayer(int64_t layer, const StepLayout& layout, int64_t tokens,
                                  int64_t seqs, bool decode_only) {
  const ModelConfig& c = config_;
  const LayerWeights& w = layers_[layer];
  if (layer == 0) {  // the embeddings: nothing to add yet
    kc::RmsNormParams norm{.input = residual_.get(), .weight = w.input_norm,
                           .output = normed_.get(), .num_tokens = tokens,
                           .hidden_size = c.hidden_size,
                           .epsilon = static_cast<float>(c.rms_norm_eps), .dtype = kernel_dtype_};
    LMSERVE_CUDA_RETURN(kc::Launch(norm, stream_), "RMSNorm");
  } else {
    LMSERVE_STATUS_RETURN(AddNorm(w.input_norm, tokens, "add + RMSNorm"));
  }
  LMSERVE_STATUS_RETURN(Gemm(kQkv, layer, tokens, normed_.get(), qkv_.get()));
  kc::QkvPostProcessParams post{
      .qkv = qkv_.get(),
      .bias = w.qkv_bias,
      .positions = In<int32_t>(layout.positions),
      .cos_sin = cos_sin_.as<float>(),
      .slot_mapping = In<int64_t>(layout.slots),
      .query_out = qkv_.get(),
      .key_cache = KeyCache(layer),
      .value_cache = ValueCache(layer),
      .num_tokens = tokens,
      .num_heads = c.num_attention_heads,
      .num_kv_heads = c.num_kv_heads,
      .head_dim = c.head_dim,
      .block_size = block_size_,
      .num_blocks = num_blocks_,
      .qkv_stride = qkv_dim_,
      .query_out_stride = qkv_dim_,
      .max_position = c.max_position_embeddings,
      .layout = c.rope.layout == RopeLayout::kInterleaved ? kernels::RotaryLayout::kInterleaved
                                                          : kernels::RotaryLayout::kHalfSplit,
      .dtype = kernel_dtype_};
  LMSERVE_CUDA_RETURN(kc::Launch(post, stream_), "QKV post-processing");
  if (dtype_ == RunnerDType::kFloat32) {
    // One fp32 kernel for decode and prefill tokens alike (the others are bf16 tensor-core ones).
    const auto attn =
        RaggedAttentionParams<kc::PagedAttentionF32Params>(layout, layer, tokens, seqs);
    LMSERVE_CUDA_RETURN(kc::Launch(attn, stream_), "attention");
  } else if (decode_only) {
    auto attn = PagedAttentionParams<kc::DecodeAttentionParams>(layout, layer, seqs);
    attn.workspace = decode_workspace_.get();
    attn.max_splits = decode_splits_.at(seqs);
    LMSERVE_CUDA_RETURN(kc::Launch(attn, stream_), "decode attention");
  } else {
    kc::PrefillAttentionParams attn = PrefillParams(layout, layer, tokens, seqs);
    attn.plan_ready = true;  // Forward planned the step
    LMSERVE_CUDA_RETURN(kc::Launch(attn, stream_), "prefill attention");
  }
  LMSERVE_STATUS_RETURN(Gemm(kOut, layer, tokens, attention_.get(), projected_.get()));
  LMSERVE_STATUS_RETURN(AddNorm(w.post_norm, tokens, "add + RMSNorm"));
  LMSERVE_STATUS_RETURN(
      Gemm(kGateUp, layer, tokens, normed_.get(), gate_up_.get(), activation_.get()));
  LMSERVE_STATUS_RETURN(Gemm(kDown, layer, tokens, activation_.get(), projected_.get()));
  return absl::OkStatus();
}

absl::Status CudaRunner::Forward(const StepLayout& layout, int64_t tokens, int64_t seqs,
                                 int64_t rows, bool decode_only, bool rows_are_tokens) {
  const ModelConfig& c = config_;
  kc::EmbeddingParams embed{.table = embed_, .ids = In<int32_t>(layout.token_ids),
                            .output = residual_.get(), .num_tokens = tokens,
                            .vocab_size = c.vocab_size, .hidden_size = c.hidden_size,
                            .dtype = kernel_dtype_};
  LMSERVE_CUDA_RETURN(kc::Launch(embed, stream_), "embedding");
  if (!decode_only && dtype_ == RunnerDType::kBFloat16) {
    LMSERVE_CUDA_RETURN(kc::LaunchPrefillPlan(PrefillParams(layout, 0, tokens, seqs), stream_),
                        "prefill plan");
  }
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    LMSERVE_STATUS_RETURN(RunLayer(layer, layout, tokens, seqs, decode_only));
  }
  if (rows == 0) return absl::OkStatus();
  // The last MLP's residual add and the final norm (every token: cheaper than a gather first),
  // then the rows that need logits.
  LMSERVE_STATUS_RETURN(AddNorm(final_norm_, tokens, "final norm"));
  const void* hidden_rows = normed_.get();
  if (!rows_are_tokens) {
    kc::EmbeddingParams gather{.table = normed_.get(), .ids = In<int32_t>(layout.logits_rows),
                               .output = rows_.get(), .num_tokens = rows,
                               .vocab_size = tokens, .hidden_size = c.hidden_size,
                               .dtype = kernel_dtype_};
    LMSERVE_CUDA_RETURN(kc::Launch(gather, stream_), "gathering the logits rows");
    hidden_rows = rows_.get();
  }
  // Only the first chunk is computed here; Execute runs any further chunks (rows beyond
  // logits_chunk_rows_ come only with kAll sequences, never in a graph).
  const int64_t chunk = std::min(rows, logits_chunk_rows_);
  LMSERVE_STATUS_RETURN(Gemm(kLmHead, 0, chunk, hidden_rows, logits_.get()));
  return SampleRows(layout, 0, chunk);
  return absl::OkStatus();
}

absl::Status CudaRunner::SampleRows(const StepLayout& layout, int64_t first_row,
                                    int64_t num_rows) {
  // logits_ holds rows [first_row, first_row + num_rows); the settings are indexed by row.
  kc::SamplingParams sample{.logits = logits_.as<float>(),
                            .output = sampled_.as<int32_t>() + first_row,
                            .temperature = In<float>(layout.temperature) + first_row,
                            .top_k = In<int32_t>(layout.top_k) + first_row,
                            .top_p = In<float>(layout.top_p) + first_row,
                            .min_p = In<float>(layout.min_p) + first_row,
                            .seeds = In<uint64_t>(layout.seeds) + first_row,
                            .steps = In<uint64_t>(layout.steps) + first_row,
                            .num_rows = num_rows,
                            .vocab_size = config_.vocab_size,
                            .workspace = sampler_workspace_.get()};
  LMSERVE_CUDA_RETURN(kc::Launch(sample, stream_), "sampling");
  LMSERVE_CUDA_RETURN(cudaMemcpyAsync(h_sampled_.as<int32_t>() + first_row,
                                      sampled_.as<int32_t>() + first_row, num_rows * 4,
                                      cudaMemcpyDeviceToHost, stream_),
                      "copying the sampled tokens");
  return absl::OkStatus();
}

StepLayout CudaRunner::PackInputs(const StepBatch& batch, int64_t padded_seqs, bool decode_only) {
  const int64_t seqs = batch.num_seqs();
  const int64_t tokens = decode_only ? padded_seqs : batch.num_tokens();
  // Device rows: every kLast/kSample sequence's last token, every kAll sequence's tokens; a
  // padded decode step gives its padding sequences a row each (greedy, ignored).
  row_token_.clear();
  row_seq_.clear();
  row_samples_.clear();
  for (int64_t i = 0; i < seqs; ++i) {
    const int32_t begin = batch.query_start[i], end = batch.query_start[i + 1];
    switch (batch.logits_modes[i]) {
      case LogitsMode::kNone:
        break;
      case LogitsMode::kLast:
      case LogitsMode::kSample:
        row_token_.push_back(end - 1);
        row_seq_.push_back(static_cast<int32_t>(i));
        row_samples_.push_back(batch.logits_modes[i] == LogitsMode::kSample);
        break;
      case LogitsMode::kAll:
        for (int32_t t = begin; t < end; ++t) {
          row_token_.push_back(t);
          row_seq_.push_back(static_cast<int32_t>(i));
          row_samples_.push_back(false);
        }
        break;
    }
  }
  for (int64_t i = seqs; i < padded_seqs; ++i) {
    row_token_.push_back(static_cast<int32_t>(i));
    row_seq_.push_back(-1);
    row_samples_.push_back(false);
  }
  const int64_t rows = static_cast<int64_t>(row_token_.size());
  const int64_t table_ids = static_cast<int64_t>(batch.block_table_ids.size());
  const int64_t layout_seqs = decode_only ? padded_seqs : seqs;
  const StepLayout l = StepLayout::For(tokens, layout_seqs, rows, table_ids);

  int64_t* slots = HostIn<int64_t>(l.slots);
  int32_t* ids = HostIn<int32_t>(l.token_ids);
  int32_t* positions = HostIn<int32_t>(l.positions);
  int32_t* query_start = HostIn<int32_t>(l.query_start);
  int32_t* context_lens = HostIn<int32_t>(l.context_lens);
  int32_t* table_start = HostIn<int32_t>(l.block_table_start);
  for (int64_t i = 0; i < seqs; ++i) {
    const int32_t begin = batch.query_start[i], end = batch.query_start[i + 1];
    const int32_t first_position = batch.context_lens[i] - (end - begin);
    const int32_t* table = batch.block_table_ids.data() + batch.block_table_start[i];
    for (int32_t t = begin; t < end; ++t) {
      const int32_t position = first_position + (t - begin);
      ids[t] = batch.token_ids[t];
      positions[t] = position;
      slots[t] = int64_t{table[position / block_size_]} * block_size_ + position % block_size_;
    }
    query_start[i] = begin;
    context_lens[i] = batch.context_lens[i];
    table_start[i] = batch.block_table_start[i];
  }
  for (int64_t i = seqs; i < layout_seqs; ++i) {  // padding: nothing read, nothing written
    ids[i] = 0;
    positions[i] = 0;
    slots[i] = -1;
    query_start[i] = static_cast<int32_t>(i);
    context_lens[i] = 0;
    table_start[i] = static_cast<int32_t>(table_ids);
  }
  query_start[layout_seqs] = static_cast<int32_t>(tokens);
  table_start[layout_seqs] = static_cast<int32_t>(table_ids);
  if (table_ids > 0) {
    std::memcpy(HostIn<int32_t>(l.block_table_ids), batch.block_table_ids.data(),
                static_cast<size_t>(table_ids) * 4);
  }
  int32_t* logits_rows = HostIn<int32_t>(l.logits_rows);
  float* temperature = HostIn<float>(l.temperature);
  int32_t* top_k = HostIn<int32_t>(l.top_k);
  float* top_p = HostIn<float>(l.top_p);
  float* min_p = HostIn<float>(l.min_p);
  uint64_t* seeds = HostIn<uint64_t>(l.seeds);
  uint64_t* steps = HostIn<uint64_t>(l.steps);
  for (int64_t r = 0; r < rows; ++r) {
    logits_rows[r] = row_token_[r];
    RunnerSampling s;  // greedy: rows that only return logits, and padding
    if (row_samples_[r]) s = batch.sampling[row_seq_[r]];
    temperature[r] = s.temperature;
    top_k[r] = s.top_k;
    top_p[r] = s.top_p;
    min_p[r] = s.min_p;
    seeds[r] = s.seed;
    steps[r] = s.step;
  }
  return l;
}

absl::Status CudaRunner::Execute(const StepBatch& batch, StepOutput* output) {
  LMSERVE_STATUS_RETURN(ValidateStepBatch(batch, config_, block_size_, num_blocks_));
  const int64_t seqs = batch.num_seqs();
  const int64_t tokens = batch.num_tokens();
  if (tokens > max_tokens_ || seqs > max_seqs_ ||
      static_cast<int64_t>(batch.block_table_ids.size()) > max_table_ids_) {
    return absl::InvalidArgumentError(
        StrCat("step batch: ", seqs, " sequences, ", tokens, " tokens and ",
               batch.block_table_ids.size(), " table entries exceed the CUDA runner's limits (",
               max_seqs_, ", ", max_tokens_, ", ", max_table_ids_, ")"));
  }
  output->logits_row_start.assign(static_cast<size_t>(seqs + 1), 0);
  output->sampled_tokens.assign(static_cast<size_t>(seqs), -1);
  output->logits.clear();
  if (seqs == 0) return absl::OkStatus();

  // Decode-only: one new token per sequence, each with a logits row.
  bool decode_only = tokens == seqs;
  for (int64_t i = 0; i < seqs; ++i) {
    if (batch.logits_modes[i] == LogitsMode::kNone) decode_only = false;
  }
  // A decode step takes the graph of the smallest bucket that holds it.
  int64_t padded = seqs;
  const Graph* graph = nullptr;
  if (decode_only) {
    auto it = graphs_.lower_bound(seqs);
    if (it != graphs_.end()) {
      padded = it->first;
      graph = &it->second;
    }
  }
  const StepLayout layout = PackInputs(batch, padded, decode_only);
  const int64_t rows = static_cast<int64_t>(row_token_.size());
  const int64_t step_tokens = decode_only ? padded : tokens;
  LMSERVE_CUDA_RETURN(cudaMemcpyAsync(d_inputs_.get(), h_inputs_.get(), layout.total,
                                      cudaMemcpyHostToDevice, stream_),
                      "copying the step's inputs");
  bool rows_are_tokens = rows == step_tokens;
  for (int64_t r = 0; rows_are_tokens && r < rows; ++r) rows_are_tokens = row_token_[r] == r;
  if (graph != nullptr) {
    LMSERVE_CUDA_RETURN(cudaGraphLaunch(graph->exec, stream_), "replaying a decode graph");
  } else {
    const int64_t seqs_here = decode_only ? padded : seqs;
    LMSERVE_STATUS_RETURN(
        Forward(layout, step_tokens, seqs_here, rows, decode_only, rows_are_tokens));
  }

  // Outputs: logits rows of kLast/kAll sequences, tokens of kSample ones.
  int64_t num_output_rows = 0;
  row_output_.assign(static_cast<size_t>(rows), -1);
  for (int64_t r = 0; r < rows; ++r) {
    if (row_seq_[r] < 0) continue;
    if (!row_samples_[r]) row_output_[r] = num_output_rows++;
    ++output->logits_row_start[row_seq_[r] + 1];
    if (row_samples_[r]) --output->logits_row_start[row_seq_[r] + 1];
  }
  for (int64_t i = 0; i < seqs; ++i) {
    output->logits_row_start[i + 1] += output->logits_row_start[i];
  }
  const int64_t vocab = config_.vocab_size;
  output->logits.resize(static_cast<size_t>(num_output_rows * vocab));
  const void* hidden_rows = rows_are_tokens ? normed_.get() : rows_.get();
  for (int64_t chunk_start = 0; chunk_start < rows; chunk_start += logits_chunk_rows_) {
    const int64_t chunk = std::min(logits_chunk_rows_, rows - chunk_start);
    if (chunk_start > 0) {  // the first chunk ran in Forward (or the graph)
      LMSERVE_STATUS_RETURN(Gemm(kLmHead, 0, chunk,
                                 static_cast<const unsigned char*>(hidden_rows) +
                                     chunk_start * config_.hidden_size * element_bytes_,
                                 logits_.get()));
      // A sampled row can sit past the first chunk (a long kAll sequence before it).
      if (std::any_of(row_samples_.begin() + chunk_start,
                      row_samples_.begin() + chunk_start + chunk, [](bool b) { return b; })) {
        LMSERVE_STATUS_RETURN(SampleRows(layout, chunk_start, chunk));
      }
    }
    // Copy each run of consecutive output rows at once.
    for (int64_t r = chunk_start; r < chunk_start + chunk;) {
      if (row_output_[r] < 0) {
        ++r;
        continue;
      }
      int64_t end = r + 1;
      while (end < chunk_start + chunk && row_output_[end] == row_output_[end - 1] + 1) ++end;
      LMSERVE_CUDA_RETURN(
          cudaMemcpyAsync(output->logits.data() + row_output_[r] * vocab,
                          logits_.as<float>() + (r - chunk_start) * vocab,
                          static_cast<size_t>((end - r) * vocab) * sizeof(float),
                          cudaMemcpyDeviceToHost, stream_),
          "copying logits");
      r = end;
    }
  }
  LMSERVE_CUDA_RETURN(cudaStreamSynchronize(stream_), "running the step");
  for (int64_t r = 0; r < rows; ++r) {
    if (row_samples_[r]) output->sampled_tokens[row_seq_[r]] = h_sampled_.as<int32_t>()[r];
  }
  return absl::OkStatus();
}

absl::Status CudaRunner::CaptureGraphs() {
  // Plans (autotuned: they serve every decode step) and a warm-up run of every bucket before
  // capture, so that nothing is allocated or loaded while capturing.
  const std::vector<int32_t> sizes = CudaGraphBatchSizes(static_cast<int32_t>(max_seqs_));
  StepBatch empty;
  for (int32_t b : sizes) {
    for (int p = 0; p < kNumProjections; ++p) {
      absl::StatusOr<const kc::GemmPlan*> plan = Plan(static_cast<Projection>(p), b, true);
      if (!plan.ok()) return plan.status();
    }
  }
  for (auto it = sizes.rbegin(); it != sizes.rend(); ++it) {
    const int64_t b = *it;
    const StepLayout layout = PackInputs(empty, b, /*decode_only=*/true);
    LMSERVE_CUDA_RETURN(cudaMemcpyAsync(d_inputs_.get(), h_inputs_.get(), layout.total,
                                        cudaMemcpyHostToDevice, stream_),
                        "copying graph inputs");
    LMSERVE_STATUS_RETURN(Forward(layout, b, b, b, true, true));  // warm-up
    LMSERVE_CUDA_RETURN(cudaStreamSynchronize(stream_), "warming up a decode graph");
    Graph graph;
    LMSERVE_CUDA_RETURN(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                        "beginning a graph capture");
    const absl::Status forward = Forward(layout, b, b, b, true, true);
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph.graph);
    LMSERVE_STATUS_RETURN(forward);
    LMSERVE_CUDA_RETURN(end, StrCat("capturing the decode graph of batch ", b));
    LMSERVE_CUDA_RETURN(cudaGraphInstantiate(&graph.exec, graph.graph, 0),
                        "instantiating a decode graph");
    graphs_[b] = graph;
  }
  // Upload once so the first replay does not pay for it.
  for (auto& [b, graph] : graphs_) {
    LMSERVE_CUDA_RETURN(cudaGraphUpload(graph.exec, stream_), "uploading a decode graph");
  }
  LMSERVE_CUDA_RETURN(cudaStreamSynchronize(stream_), "capturing decode graphs");
  return absl::OkStatus();
}

RunnerStats CudaRunner::stats() const {
  RunnerStats s;
  s.dtype = dtype_;
  s.weight_bytes = weight_bytes_;
  s.kv_cache_bytes = kv_pool_.bytes();
  s.workspace_bytes = residual_.bytes() + normed_.bytes() + projected_.bytes() + rows_.bytes() +
                      qkv_.bytes() + attention_.bytes() + gate_up_.bytes() + activation_.bytes() +
                      logits_.bytes() + d_inputs_.bytes() + decode_workspace_.bytes() +
                      prefill_workspace_.bytes() + gemm_workspace_.bytes() + cos_sin_.bytes() +
                      sampled_.bytes() + sampler_workspace_.bytes();
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    s.device_memory_used_bytes = static_cast<int64_t>(total_bytes - free_bytes);
    s.device_memory_total_bytes = static_cast<int64_t>(total_bytes);
  } else {
    cudaGetLastError();
  }
  s.startup_seconds = startup_seconds_;
  s.num_cuda_graphs = static_cast<int32_t>(graphs_.size());
  s.device_name = device_name_;
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRunner(const Checkpoint& checkpoint,
                                                              const RunnerConfig& config) {
  return CudaRunner::Create(checkpoint, config);
}

absl::Status CheckCudaRunnerDevice(int32_t device) {
  const int num_devices = CudaDeviceCount();
  if (device < 0 || device >= num_devices) {
    return absl::FailedPreconditionError(StrCat("no CUDA GPU ", device, " on this machine (",
                                                num_devices, " found)"));
  }
  cudaDeviceProp prop{};
  if (const cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        StrCat("CUDA GPU ", device, ": cannot read its properties: ", cudaGetErrorString(e)));
  }
  if (prop.major < 9) {
    return absl::FailedPreconditionError(StrCat(
        "CUDA GPU ", device, " (", prop.name, ") has compute capability ", prop.major, ".",
        prop.minor, "; this build's kernels need 9.0 or later (Hopper)"));
  }
  return absl::OkStatus();
}

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the "no driver" error
    return 0;
  }
  return count;
}

}  // namespace lmserve::engine
