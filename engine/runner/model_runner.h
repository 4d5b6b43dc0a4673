// The model runner: computes one engine step, a batch of sequences, on one backend.
//
// Contract (the CPU and CUDA runners; each implements the forward ops of engine/model/ops.h and
// runs the model family's forward pass over them):
// - The runner owns the model weights and the paged KV cache: `num_kv_blocks()` blocks of
//   `block_size_tokens()` token slots each, for every layer. Block ids are integers in
//   [0, num_kv_blocks()); which sequence owns which block is the caller's business (the engine's
//   block manager): the runner only reads and writes the slots the block tables name.
// - A step is a ragged batch. Sequence i computes `query_lens[i]` new tokens at positions
//   [context_lens[i] - query_lens[i], context_lens[i]): their K/V are written into the cache slots
//   that its block tables give for those positions, and attention reads positions
//   [0, context_lens[i]) through the same tables (a layer with a sliding window W only the last
//   W positions before each query: AttentionLayer::window). A layer reads and writes through the
//   table of its KV cache group (kv_group_windows()). Prefills (many tokens), chunked prefills and
//   prefix hits (a prompt starting mid-sequence) and decodes (one token) mix freely in one step.
// - Logits are produced only for the rows asked for: the last token of a sequence, or all of its
//   tokens (teacher-forced scoring, prompt logprobs).
//
// Thread safety: a runner is used by one thread at a time (the engine thread).

#ifndef LMSERVE_ENGINE_RUNNER_MODEL_RUNNER_H_
#define LMSERVE_ENGINE_RUNNER_MODEL_RUNNER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/kv_cache_groups.h"
#include "engine/model/model_config.h"
#include "kernels/dtype.h"

namespace lmserve::engine {

class Checkpoint;
class Communicator;
struct AttentionLayer;

enum class LogitsMode : uint8_t {
  kNone,    // no logits (a prefill chunk that does not end the prompt)
  kLast,    // the last token's logits
  kAll,     // every token's logits
  kSample,  // the runner picks the next token from the last token's logits itself
            // (StepBatch::sampling) and returns only the token: no logits row
};

// Token selection done by the runner, for LogitsMode::kSample (as kernels/cpu/sampling.h defines
// it: temperature <= 0 is greedy; top-k, top-p, min-p; the draw is a function of seed and step).
struct RunnerSampling {
  float temperature = 0.0f;
  int32_t top_k = 0;     // <= 0: off
  float top_p = 1.0f;    // >= 1: off
  float min_p = 0.0f;    // <= 0: off
  uint64_t seed = 0;
  uint64_t step = 0;     // the draw counter: the engine passes the token's position
  // Structured output: the row is masked by its row of StepBatch::token_bitmask before the draw
  // (only for a runner whose samples_with_token_bitmask() is true).
  bool masked = false;
};

// A token of a step that the step launched before it draws (StepBatch::pending_tokens).
struct PendingToken {
  int32_t token = 0;         // its index in StepBatch::token_ids
  int32_t launched_seq = 0;  // the drawing sequence's index in the step launched before
};

// One step's batch, in the compressed-sparse-row form that GPU kernels take. Sequences may come in
// any order; the engine puts those of one new token first, which the CUDA runner's attention takes
// in one decode-kernel launch (the rest on its prefill kernel).
//
// Block tables: the model's KV cache layers come in `num_kv_groups` groups
// (ModelRunner::kv_group_windows, engine/model/kv_cache_groups.h), each with a table per sequence;
// row i * num_kv_groups + g of the CSR is sequence i's table in group g, its entry j the block
// holding positions [j*B, (j+1)*B) of the group's layers. In a group of window W > 0, the entries
// of blocks wholly before the first key that the sequence's first new token sees (j with
// (j+1)*B <= context_len - query_len - W + 1) may be -1: no query of the step reads them.
struct StepBatch {
  std::vector<int32_t> token_ids;             // [num_tokens]: every sequence's new tokens, in order
  std::vector<int32_t> query_start;           // [num_seqs + 1]: sequence i owns token_ids[query_start[i]..query_start[i+1])
  std::vector<int32_t> context_lens;          // [num_seqs]: tokens in the cache after this step
  std::vector<int32_t> block_table_start;     // [num_seqs * num_kv_groups + 1]: offsets into block_table_ids, by (sequence, group)
  std::vector<int32_t> block_table_ids;       // KV block ids (-1 where a window allows it)
  std::vector<LogitsMode> logits_modes;       // [num_seqs]
  std::vector<RunnerSampling> sampling;       // [num_seqs] when any mode is kSample, else empty
  // [num_seqs]: each sequence's state slot in [0, ModelRunner::num_state_slots()), distinct, for
  // models with state-space layers (ignored by others). A sequence whose step starts at position
  // 0 starts from zero state; otherwise its slot must hold the state its earlier steps left.
  std::vector<int32_t> state_slots;
  // [num_seqs, ceil(vocab_size / 32)] when any sampling[i].masked: bit t of row i keeps token t.
  // Only masked rows are read, and only by ModelRunner::Finish (the host may write them while the
  // step's forward pass runs).
  std::vector<uint32_t> token_bitmask;
  // Async scheduling (ModelRunner::CanLaunchAhead): tokens that the step launched before this one
  // draws, which the engine has not read yet. token_ids holds 0 at each; the runner takes the
  // token from that step's draw on the device.
  std::vector<PendingToken> pending_tokens;
  int32_t num_kv_groups = 1;                  // block tables per sequence

  int32_t num_seqs() const { return static_cast<int32_t>(context_lens.size()); }
  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  // Sequence `seq`'s block table in group `group`.
  std::span<const int32_t> BlockTable(int32_t seq, int32_t group = 0) const;

  // Appends a sequence: `new_tokens` computed after `num_computed_tokens` already in the cache, its
  // blocks `block_ids` covering at least num_computed_tokens + new_tokens.size() positions.
  // REQUIRES: num_kv_groups == 1.
  // `state_slot`: its StepBatch::state_slots entry; -1: its index in the batch.
  void AddSequence(std::span<const int32_t> new_tokens, int32_t num_computed_tokens,
                   std::span<const int32_t> block_ids, LogitsMode logits_mode,
                   int32_t state_slot = -1);
  // The same with one table per KV cache group. The first sequence sets num_kv_groups.
  // REQUIRES: as many tables as earlier sequences had.
  void AddSequence(std::span<const int32_t> new_tokens, int32_t num_computed_tokens,
                   std::span<const std::span<const int32_t>> group_block_ids,
                   LogitsMode logits_mode, int32_t state_slot = -1);
  void Clear();  // num_kv_groups back to 1
};

struct StepOutput {
  // Row r of the logits belongs to the sequence and position that logits_rows names.
  std::vector<float> logits;             // [num_rows, vocab_size], fp32, row-major
  std::vector<int32_t> logits_row_start; // [num_seqs + 1]: sequence i's rows
  std::vector<int32_t> sampled_tokens;   // [num_seqs]: the token a kSample sequence drew, else -1
};

enum class Backend { kCpu, kCuda };

// "cpu", "cuda" (the names of `lmserve serve --backend`, GetModelInfo's backend).
std::string_view BackendName(Backend backend);
// The inverse of BackendName; nullopt for any other name ("auto" included).
std::optional<Backend> BackendFromName(std::string_view name);

// What `--backend auto` resolves to, and why (for the start-up log).
struct BackendChoice {
  Backend backend = Backend::kCpu;
  std::string reason;  // "CUDA device 0 is supported by this build"
};
// CUDA when this binary has the CUDA runner and CUDA device `device` is one its kernels support
// (compute capability 8.0 or later, with code in this build that the device runs); otherwise the
// CPU, with the reason it is not CUDA.
BackendChoice ChooseAutoBackend(int32_t device = 0);

// The element type a runner holds its weights, activations and KV cache in, and computes with
// (math inside kernels is fp32 either way). The CPU runner keeps the checkpoint's weight types by
// default (GGUF blocks, bf16: kNative) and converts every weight to fp32 on request (the reference
// path); the CUDA runner holds bf16 by default and fp32 on request (a numerical twin of the CPU
// runner's fp32 path, at twice the memory).
enum class RunnerDType : uint8_t {
  kAuto,      // the backend's default: bf16 on CUDA, native on the CPU
  kBFloat16,  // CUDA only
  kFloat32,
  kNative,  // CPU only: matrices in the checkpoint's types (kernels/cpu/quant_linear.h), fp32 KV
};

// "auto", "bfloat16", "float32", "native" (the names of `lmserve serve --dtype` and GetModelInfo's dtype).
std::string_view RunnerDTypeName(RunnerDType dtype);
// The inverse of RunnerDTypeName; nullopt for any other name.
std::optional<RunnerDType> RunnerDTypeFromName(std::string_view name);
// What kAuto means on `backend`; other values are returned as they are.
RunnerDType ResolveRunnerDType(RunnerDType dtype, Backend backend);
// Bytes per element of a resolved dtype (2 or 4). REQUIRES: dtype != kAuto.
int64_t RunnerDTypeBytes(RunnerDType dtype);

// How the weights of the linear layers (the decoder's QKV, output, gate/up and down projections
// and the state-space in/out projections) are held, as vLLM's --quantization. Embeddings, norms,
// the LM head and mixture-of-experts weights stay in the runner's dtype either way.
enum class RunnerQuantization : uint8_t {
  kAuto,  // the checkpoint's: FP8 checkpoints (ModelConfig::fp8) in FP8 on the CUDA runner
          // (dequantized on the CPU runner, which holds no FP8); none for every other checkpoint
  kNone,  // the runner's dtype (an FP8 checkpoint is dequantized at load)
  kFp8,   // CUDA runner in bf16 on compute capability 8.9+: FP8 E4M3 with a scale per output
          // channel (a bf16 checkpoint's weights quantized at load, kernels/cpu/fp8.h); the CPU
          // runner refuses it
  // GGUF block formats on the CUDA runner in bf16 (kernels/cuda/quant_gemm.h). kGguf keeps a
  // GGUF checkpoint's Q8_0 / Q4_0 / Q4_K / Q6_K matrices in their blocks (other types are
  // dequantized at load, as is every GGUF tensor with kAuto and kNone: blocks are opt-in while
  // decode batches of more than 8 sequences run slower on them, bench/results section 20).
  // kQ8_0 .. kQ6_K hold every linear layer in that format, for LoadFormat::kDummy only
  // (nothing quantizes a checkpoint to them). The CPU runner keeps GGUF blocks natively anyway
  // and refuses kQ8_0 .. kQ6_K.
  kGguf,
  kQ8_0,
  kQ4_0,
  kQ4_K,
  kQ6_K,
};
// "auto", "none", "fp8", "gguf", "q8_0", "q4_0", "q4_k", "q6_k"; and the inverse (nullopt for any
// other name).
std::string_view RunnerQuantizationName(RunnerQuantization quantization);
std::optional<RunnerQuantization> RunnerQuantizationFromName(std::string_view name);
// The block format of kQ8_0 .. kQ6_K; nullopt for the others.
std::optional<kernels::DType> RunnerQuantizationBlockType(RunnerQuantization quantization);

// The KV cache's element type, as vLLM's --kv-cache-dtype.
enum class KvCacheDType : uint8_t {
  kAuto,      // the runner's dtype (bf16 or fp32 on CUDA, fp32 on the CPU)
  kBFloat16,  // CUDA runner in bf16 only (the same as kAuto there)
  kFp8,       // CUDA runner in bf16 on compute capability 8.9+: E4M3 keys and values with one scale
              // per layer for each (1.0, as vLLM's default without calibrated scales), half
              // bf16's bytes a block; the CPU runner refuses it
};
// "auto", "bf16", "fp8"; the inverse also takes vLLM's "bfloat16" and "fp8_e4m3" (nullopt for any
// other name).
std::string_view KvCacheDTypeName(KvCacheDType dtype);
std::optional<KvCacheDType> KvCacheDTypeFromName(std::string_view name);

// Where the weights come from.
enum class LoadFormat {
  kCheckpoint,  // the checkpoint's tensors
  kDummy,       // random weights of the checkpoint's shapes (as vLLM's --load-format dummy): only
                // the configuration is read, so a config-only checkpoint will do
};

// The CUDA runner's kernel for the projections of steps of at most 8 tokens (decode batches).
enum class DecodeGemm : uint8_t {
  kAuto,    // one token: the skinny GEMM; 2 to 8: whichever of it and cuBLASLt timed faster at
            // start-up
  kBlas,    // cuBLASLt always
  kSkinny,  // the skinny GEMM wherever it applies (bf16, up to 8 rows)
};
// "auto", "blas", "skinny"; and the inverse (nullopt for any other name).
std::string_view DecodeGemmName(DecodeGemm choice);
std::optional<DecodeGemm> DecodeGemmFromName(std::string_view name);

// The CUDA kernels' code path (kernels/cuda/device.h, KernelPath). Decode attention's tile loads
// (bulk copies and mbarriers) and programmatic dependent launch are Hopper's; every other kernel
// has one path for sm_80 and newer.
enum class CudaKernelPath : uint8_t {
  kAuto,      // Hopper's on a GPU of compute capability 9.0+ running this build's sm_90+ code;
              // the portable path (cp.async, mma.sync, ldmatrix) otherwise
  kPortable,  // the portable path on every GPU (on a Hopper GPU: what an A100 or L40S runs)
};
// "auto", "portable"; and the inverse (nullopt for any other name).
std::string_view CudaKernelPathName(CudaKernelPath path);
std::optional<CudaKernelPath> CudaKernelPathFromName(std::string_view name);

struct RunnerConfig {
  Backend backend = Backend::kCpu;
  // Weights, activations and KV cache. The CPU runner rejects kBFloat16 (InvalidArgument).
  RunnerDType dtype = RunnerDType::kAuto;
  RunnerQuantization quantization = RunnerQuantization::kAuto;
  KvCacheDType kv_cache_dtype = KvCacheDType::kAuto;
  LoadFormat load_format = LoadFormat::kCheckpoint;
  int32_t block_size_tokens = 16;
  // Memory for the KV pool, all layers. The CUDA runner: 0 sizes the pool from
  // gpu_memory_utilization instead.
  int64_t kv_cache_bytes = int64_t{1} << 30;
  int32_t num_threads = 0;  // CPU threads for matrix products and attention; 0: physical cores
  // CPU, native weights in GGUF blocks: quantize the input of each matrix product to one int8 part
  // (llama.cpp's form) instead of two (kernels/cpu/quant_linear.h, precise_input): faster, with a
  // relative L2 error of about 3e-2 against the fp32 path where two parts give 1e-4.
  bool cpu_int8_activations = false;
  // CPU, native weights: steps of at least this many tokens convert weight tiles to fp32 and use
  // sgemm (QuantLinearParams::gemm_min_tokens); 0: never (every step on the integer path). Steps
  // of up to 8 tokens read Q8_0/Q4_0/Q4_1 rows in place, faster than sgemm there (demo model, 1
  // thread: 8 tokens 53.9 ms on sgemm, 7 in place 38.8 ms).
  int32_t cpu_gemm_min_tokens = 9;
  // The longest context served (the engine's max_model_len): the model is described with its
  // max_position_embeddings capped at it, which sizes the runner's tables and picks longrope's
  // factors. 0: the model's own.
  int64_t max_context_len = 0;
  // Steps are at most this large (the engine's limits). The CUDA runner sizes its workspaces and
  // CUDA graphs for them at start-up; both runners count them in their memory plan.
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 8192;
  double gpu_memory_utilization = 0.9;  // the share of the GPU's memory the runner may hold
  bool cuda_graphs = true;              // capture decode-only steps as CUDA graphs
  // CUDA runner: structured output's masked rows are sampled on the device (the engine's host
  // masks, computed while the forward pass runs, uploaded and applied by a token-bitmask kernel
  // before the sampler) instead of coming back as logits to be masked and sampled on the host.
  bool device_token_bitmask = true;
  // CUDA runner, device_token_bitmask: how long a masked step's draw waits on the GPU for the
  // step's masks (they are released by ModelRunner::Finish) before it gives up, draws its rows
  // unmasked and the step fails (DeadlineExceeded). A bound, so that a host that never finishes
  // a step cannot hang the GPU; far above any step's mask time.
  double device_mask_wait_seconds = 10.0;
  // CUDA runner, device_token_bitmask: every masked row's block polls the host-mapped release
  // word itself (the design before one poller a step: 64 rows' polls made the masking kernel take
  // ~70 us on an H100). For measurements against it only.
  bool device_mask_poll_per_row = false;
  // CUDA runner, device_token_bitmask: the masking kernel reads the masks from their pinned
  // staging over PCIe (no copy to the device while the forward pass runs). For measurements.
  bool device_mask_read_pinned = false;
  // CUDA runner: time each step on the device (CUDA events around its work on the stream) into
  // RunnerStats::total_device_step_seconds. For benchmarks: two event records a step.
  bool time_device_steps = false;
  int32_t device = 0;                   // CUDA device ordinal
  DecodeGemm decode_gemm = DecodeGemm::kAuto;
  // CUDA runner in bf16: hold the residual stream in fp32 (the embeddings, every residual add,
  // the norms' input), the rest in bf16, so that the stream is not rounded to bf16 at each add.
  // Float32 mode holds everything in fp32 either way.
  bool fp32_residual = true;
  // Chain the step's kernels by programmatic dependent launch (sm_90): each launches while its
  // predecessor finishes. Process-wide in effect: the last CUDA runner created sets it.
  bool programmatic_launch = true;
  // CUDA runner, Mamba-2 decode steps of one token: the gated RMSNorm folded into the SSM decode
  // kernel (its gating) and out_proj's skinny GEMM (its scale) instead of a kernel of its own
  // (kernels/cuda/ssm.h, SsmDecodeGatedNorm).
  bool fuse_ssm_norm = true;
  // CUDA runner, steps of one token in bf16 with the fp32 residual: the add + RMSNorm before a
  // product folded into the product's skinny GEMM (the 16-bit, the FP8 or GGUF blocks' integer
  // products, kernels/cuda/quant_gemm.h: each block adds and normalizes the row itself),
  // the residual's add left to the next product into the addend (kernels/cuda/skinny_gemm.h,
  // add_norm_residual and settle_residual), instead of a kernel of its own. And in FP8 steps of
  // more than 8 tokens, the per-token quantization of an FP8 GEMM's input done by the add +
  // RMSNorm or the gated activation before it, which write E4M3 rows and their scales instead of
  // bf16 rows (FusedAddRmsNormParams and SiluAndMulParams::f8_output), instead of a pass of its
  // own.
  bool fold_add_norm = true;
  // CUDA runner: in an eager step, the leading sequences of one new token run on the decode
  // attention kernel and the rest on the prefill kernel; false: every sequence on the prefill
  // kernel (as before 2026-11-27, for comparison).
  bool split_mixed_attention = true;
  // CUDA runner: the skinny GEMM's L2 prefetch before its programmatic-launch wait, in bytes a
  // product (kernels/cuda/skinny_gemm.h, l2_prefetch_bytes); 0: none.
  int64_t skinny_l2_prefetch_bytes = 0;
  // CUDA runner: the skinny GEMM at one row splits k over two warps a row pair where its grid
  // would make fewer than 2 blocks a multiprocessor (skinny_gemm.h, k_split 0); off: never.
  bool skinny_split_k = true;
  // CUDA runner: a cuBLASLt GEMM of more than kMinTunedGemmRows (gemm_selector.h) tokens has its
  // algorithm chosen by timing cuBLASLt's candidates on the step's own operands, once per
  // projection and power-of-two bucket of token counts (the first step of a bucket takes the
  // time, tens of ms a projection at thousands of tokens); off: cuBLASLt's heuristic choice,
  // which measured as fast at the 8B prefill's shapes (bench/results section 18.1).
  bool tune_prefill_gemms = false;
  // CUDA runner, bf16 fp32 residual, whole models: in steps of more than kMinTunedGemmRows tokens,
  // not decode-only, a projection whose output is next added to the residual stream (Linear into
  // kProjected, then AddRmsNorm or FinalNorm of it: o_proj and down in Llama) adds itself to the
  // fp32 residual in cuBLASLt's epilogue (beta 1, unrounded), and the norm reads the residual
  // alone: one pass over the rows fewer, and no rounding of the product to bf16.
  bool fuse_residual_gemm = true;
  // CUDA runner, Hopper, 16-bit weights: a gated MLP's [gate; up] product in steps of at least
  // kMinSm90GatedRows (gemm_selector.h) tokens runs the GEMM of our own with the activation in its
  // epilogue (kernels/cuda/gemm_sm90.h) instead of cuBLASLt and the SiLU-and-mul kernel. Off: in
  // the 8B prefill step the fused kernel took as long as the two it replaces (bench/results
  // section 30), its product alone 9% slower than cuBLASLt's.
  bool sm90_gated_gemm = false;
  // CUDA runner: the SSM decode kernel lets the next kernel (out_proj) launch only once its own
  // stores are issued, instead of right after its wait (ssm.h, late_dependents).
  bool ssm_decode_late_dependents = false;
  // CUDA runner: a prefill step's SSM conv and scan by the earlier kernels (the one-channel-a-
  // thread conv, the scan's recurrence on the CUDA cores) instead of the vectorized conv and the
  // chunked SSD scan on tensor cores (kernels/cuda/ssm.h; for A/B runs). float32 runs the
  // recurrence either way.
  bool ssm_prefill_legacy = false;
  // CUDA runner: the SSD scan's warps a block (kernels/cuda/ssm.h, ssd_warps): 4 or 8; 0: the
  // kernel's default.
  int ssm_scan_warps = 0;
  // The CUDA kernels' path; kPortable also turns programmatic dependent launch off (it is
  // Hopper's). Process-wide in effect, as programmatic_launch.
  CudaKernelPath cuda_kernel_path = CudaKernelPath::kAuto;
  // Tensor parallelism over this many ranks (tensor_parallel_runner.h): CUDA devices device,
  // device + 1, ...; on the CPU, shards in threads of this process (the twin that tests the
  // sharding). 1: one runner holds the whole model.
  int32_t tensor_parallel_size = 1;
  // Set by the tensor-parallel runner for each rank's runner (whose model is the rank's share):
  // the rank's collectives. Null: a whole model.
  Communicator* communicator = nullptr;
};

// Memory and start-up figures of a runner, for logs and metrics.
struct RunnerStats {
  RunnerDType dtype = RunnerDType::kFloat32;  // what the runner holds and computes in (resolved)
  // The linear layers' weights (resolved: kNone or kFp8).
  RunnerQuantization quantization = RunnerQuantization::kNone;
  // The KV cache's element type (resolved: kFp8, or kAuto for the runner's dtype).
  KvCacheDType kv_cache_dtype = KvCacheDType::kAuto;
  int64_t weight_bytes = 0;     // weights as the runner holds them
  int64_t kv_cache_bytes = 0;   // the KV pool
  int64_t workspace_bytes = 0;  // device buffers besides weights and KV (activations, logits,
                                // kernel workspaces); 0 where they grow with the batch (CPU)
  int64_t device_memory_used_bytes = 0;   // GPU memory in use on the device (all processes); 0 on CPU
  int64_t device_memory_total_bytes = 0;  // the GPU's memory; 0 on CPU
  double startup_seconds = 0;   // Create(), weights, graph capture included
  int32_t num_cuda_graphs = 0;  // decode batch sizes captured
  int64_t num_graph_replays = 0;  // steps run by replaying one (masked steps included)
  // CUDA: gated products run by the Hopper GEMM with the activation in its epilogue
  // (RunnerConfig::sm90_gated_gemm), counted as they are enqueued.
  int64_t num_sm90_gated_gemms = 0;
  // CUDA: eager steps whose attention ran on both kernels: their leading sequences of one new
  // token on the decode kernel, the rest on the prefill kernel.
  int64_t num_split_attention_steps = 0;
  // CUDA: add + RMSNorms folded into the product after them (RunnerConfig::fold_add_norm, steps
  // of one token), counted as they are enqueued (eager steps and graph captures, not replays).
  int64_t num_folded_add_norms = 0;
  std::string device_name;      // "NVIDIA H100 80GB HBM3", or "cpu"
  // CUDA: the kernels' path as resolved on the device ("Hopper kernels (sm_90 code)",
  // "portable kernels (sm_80 code)"); empty on the CPU.
  std::string cuda_kernels;
  // CUDA runner, structured output on the device (device_token_bitmask): steps with masked rows,
  // the host's time in Finish uploading their masks (copy into pinned memory, the copy to the
  // device, waited for, then the release), and the device's time waiting for the release (the
  // draw's poll, from the GPU's clock: > 0 when the host's masks came after the forward pass).
  int64_t num_masked_steps = 0;
  double total_mask_upload_seconds = 0;
  double total_mask_wait_seconds = 0;
  // time_device_steps: the steps' device time (from the first kernel enqueued to the last copy
  // back) and how many steps were timed.
  int64_t num_timed_device_steps = 0;
  double total_device_step_seconds = 0;
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;

  // Builds a runner for `checkpoint`'s model (its family's description, engine/model/family.h);
  // weights are converted or copied out of it: the checkpoint may be closed afterwards.
  static absl::StatusOr<std::unique_ptr<ModelRunner>> Create(const Checkpoint& checkpoint,
                                                             const RunnerConfig& config);

  virtual const ModelConfig& model_config() const = 0;
  virtual Backend backend() const = 0;
  virtual int32_t block_size_tokens() const = 0;
  virtual int32_t num_kv_blocks() const = 0;
  // The window of each KV cache group (engine/model/kv_cache_groups.h), 0 for full attention, in
  // the order of StepBatch's block tables. Block ids are shared by the groups: an id is in one
  // group's tables at a time.
  virtual std::vector<int32_t> kv_group_windows() const { return {0}; }
  // Whether Execute implements LogitsMode::kSample on the device (the engine then sends it the
  // requests whose sampling it can do, and copies back only their tokens). The CPU runner
  // implements kSample too but says false: the engine's own sampler is the CPU reference.
  virtual bool samples_on_device() const { return false; }
  // The recurrent-state slots of a model with state-space layers (0 for others): one per running
  // sequence, which the engine assigns (StepBatch::state_slots), each holding every state-space
  // layer's conv and SSM state. Sized at start-up (RunnerConfig::max_num_seqs).
  virtual int32_t num_state_slots() const { return 0; }
  // Whether its kSample rows may be masked (RunnerSampling::masked, StepBatch::token_bitmask):
  // structured output sampled on the device. Otherwise the engine masks and samples such rows.
  virtual bool samples_with_token_bitmask() const { return false; }
  virtual RunnerStats stats() const { return {}; }

  // Runs one step. Validates the batch (token ids in the vocabulary, block ids in the pool, tables
  // long enough, contexts within the model's) and returns InvalidArgument without touching the cache
  // when it is malformed.
  virtual absl::Status Execute(const StepBatch& batch, StepOutput* output) = 0;

  // The same step in two halves, so that the host computes the step's token bitmasks
  // (structured output) while the forward pass runs:
  // - Launch(batch, output) validates the batch and starts the step: the forward pass and the
  //   logits, enqueued on a GPU (it returns while they run), computed on the CPU. Everything but
  //   the contents of batch.token_bitmask is read here; that vector must already have its size.
  // - The caller then writes the masked rows of batch.token_bitmask (the rows of
  //   RunnerSampling::masked sequences).
  // - Finish() reads the masks and completes the step: masking, sampling, the outputs. After
  //   it returns, `output` holds what Execute would have given.
  // `batch` and `output` must stay alive from Launch to Finish; no other call comes between. A
  // Launch that fails needs no Finish; after one that succeeds, Finish must come before the next
  // step. Execute(batch, output) is Launch then Finish with the masks already written.
  // The CPU runner computes the forward pass in Launch, the CUDA runner enqueues it (CUDA graphs
  // for decode) and samples in Finish. The default halves run the whole step in Finish (Execute:
  // no overlap, as the tensor-parallel runner does).
  virtual absl::Status Launch(const StepBatch& batch, StepOutput* output);
  virtual absl::Status Finish();

  // Async scheduling: whether the step launched last may stay unfinished while the next one is
  // launched. Only for a step whose outputs are tokens drawn on the device (kSample and kNone
  // rows, no token bitmasks): its Finish then only waits and reads them. The next step may take
  // those tokens as its inputs (StepBatch::pending_tokens). The calls then go Launch(A),
  // Launch(B), Finish() (A's), Finish() (B's): two steps launched at most, finished in order, and
  // each one's batch and output alive until its Finish. False by default.
  virtual bool CanLaunchAhead() const { return false; }

 private:
  // The default halves' step, between Launch and Finish.
  const StepBatch* pending_batch_ = nullptr;
  StepOutput* pending_output_ = nullptr;
};

// OK when this binary has the CUDA runner and CUDA device `device` exists and is one its kernels
// support; otherwise FailedPrecondition (Unimplemented for a build without CUDA) saying why.
absl::Status CheckCudaDevice(int32_t device = 0);

// The KV cache groups of `config`'s model (its family's description, kv_cache_groups.h): one
// group of every layer when all have one window; one full group when the config has no family.
KvCacheGroups KvCacheGroupsFor(const ModelConfig& config);
// The KV cache layers one block holds: KvCacheGroupsFor(config).layers_per_block.
int64_t KvLayersPerBlock(const ModelConfig& config);

// OK when `layer` reads no key its KV cache group may have freed: a layer of a group with window
// W must attend within a window of at most W. Runners check it in their Attention op.
absl::Status CheckLayerWindow(const AttentionLayer& layer, const KvCacheGroups& groups);

// Checks a batch against a runner's limits; every runner calls it first. `kv_group_windows`:
// the runner's (empty: one full-attention group); -1 entries are accepted only where a group's
// window allows them.
// `num_state_slots` > 0: the batch's state_slots must name distinct slots below it.
absl::Status ValidateStepBatch(const StepBatch& batch, const ModelConfig& config,
                               int32_t block_size_tokens, int32_t num_kv_blocks,
                               std::span<const int32_t> kv_group_windows = {},
                               int32_t num_state_slots = 0);

// The bytes of one state slot of `config`'s model (every state-space layer's conv and SSM state,
// fp32); 0 for a model without state-space layers.
int64_t StateSlotBytes(const ModelConfig& config);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_RUNNER_MODEL_RUNNER_H_
