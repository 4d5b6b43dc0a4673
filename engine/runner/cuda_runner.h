// The CUDA model runner: the ModelRunner contract (model_runner.h) on one NVIDIA GPU. It implements
// the forward ops (engine/model/ops.h) with the kernels of kernels/cuda and runs the model family's
// forward pass over them; its parts are under engine/runner/cuda/ (memory, weight layout, step
// inputs, GEMM selection, decode graphs).
//
// The runner holds weights, activations and the KV pool in one element type, RunnerConfig::dtype:
// bf16 (the default) or fp32 (RunnerDType::kFloat32: the CPU runner's numerical twin up to the
// order of sums, at twice the memory and a fraction of the speed). Weights live on the GPU in that
// type: GGUF-quantized and fp16/fp32/bf16 tensors are converted there at load
// (kernels/cuda/dequant.h, bit-exact with the CPU's conversion), laid out as the model's WeightPlan
// declares them (Q/K/V fused into one matrix, gate/up into another). In bf16 the residual stream
// alone is fp32 by default (RunnerConfig::fp32_residual): the embeddings are gathered into fp32
// rows, every residual add and the norm of the sum read and write it in fp32, and the normed
// outputs, projections and KV cache stay bf16. The KV pool is [num_blocks, block_size, kv_heads,
// head_dim] per layer for keys and for values; unless RunnerConfig::kv_cache_bytes says otherwise
// it takes what gpu_memory_utilization leaves after the weights, the workspaces and a reserve for
// CUDA graphs.
//
// In bf16 attention runs on the tensor-core kernels (decode and prefill) and small-batch GEMMs may
// take the skinny kernel; in fp32 every attention runs on PagedAttentionF32 (CUDA cores, fp32
// math) and every GEMM on cuBLASLt in true fp32 (no TF32), the LM head included.
//
// A step runs on one stream: one host-to-device copy of the step's inputs (ids, positions, cache
// slots, the block tables, the per-row sampling settings, packed into pinned memory), the
// family's forward pass (embedding, layers, final norm), the LM head in fp32 on only the rows that
// need logits, and, for LogitsMode::kSample rows, the sampler (kernels/cuda/sampling.h). Only what
// the engine asked for comes back: sampled token ids, and logits rows for kLast/kAll sequences.
//
// Decode-only steps (one new token per sequence, at most max_num_seqs of them) replay a CUDA graph
// captured at start-up for the smallest batch bucket that holds them (1, 2, 4, 8, then every 8);
// padding sequences have context length 0 and cache slot -1, so they read and write nothing. Every
// length, position and table is read from device memory, so a graph is valid at any context
// length. Steps with prefill tokens run eagerly.
//
// Structured output (RunnerConfig::device_token_bitmask): a masked row's draw waits on the GPU
// for its mask, which the engine computes after Launch. The draw starts with the gated token
// bitmask (kernels/cuda/token_bitmask.h), in the graphs too: Finish copies the step's masked rows
// to the device (through pinned memory, on a second stream, while the forward pass runs), waits
// for the copy and releases them by storing the step's number into a pinned, host-mapped word (a
// release store); the kernel's masked rows poll for it (an acquire load), then read their masks
// and apply them, while rows without a mask pass at once. So a masked decode step replays
// the same graph as any other. Every way out of a launched masked step releases it (Finish; a
// failed Launch, the next Launch or the destructor as abandoned, unmasked), and the device's wait
// is bounded by device_mask_wait_seconds, after which the step fails with DeadlineExceeded.

#ifndef LMSERVE_ENGINE_RUNNER_CUDA_RUNNER_H_
#define LMSERVE_ENGINE_RUNNER_CUDA_RUNNER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/checkpoint.h"
#include "engine/model/family.h"
#include "engine/runner/model_runner.h"

namespace lmserve::engine {

// Builds the CUDA runner (ModelRunner::Create with Backend::kCuda lands here). Errors:
// FailedPrecondition without a supported GPU (CheckCudaRunnerDevice),
// Unimplemented for shapes the kernels do not cover, ResourceExhausted when the weights or the KV
// pool do not fit.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCudaRunner(
    std::unique_ptr<const ModelDescription> model, const Checkpoint& checkpoint,
    const RunnerConfig& config);

// Bytes of one KV block in the CUDA runner: keys and values of the layers a block holds
// (KvLayersPerBlock: every layer, or one KV cache group's), in `dtype` (kAuto: the CUDA runner's
// default, bf16), or one byte an element with an FP8 cache (`kv_dtype` kFp8).
int64_t CudaKvBlockBytes(const ModelConfig& config, int32_t block_size_tokens, RunnerDType dtype,
                         KvCacheDType kv_dtype = KvCacheDType::kAuto);
// Bytes of one state slot in the CUDA runner (models with state-space layers; 0 for others):
// every such layer's conv ring (conv_kernel rows of conv_dim) and SSM state, fp32.
int64_t CudaStateSlotBytes(const ModelConfig& config);

// The number of CUDA devices (0 without a GPU or driver). Only in builds with the CUDA runner.
int CudaDeviceCount();

// OK when CUDA device `device` exists, has compute capability 8.0 or later (bf16 tensor cores)
// and this build holds code it runs (its own architecture's, or PTX the driver compiles);
// FailedPrecondition naming the device and its capability otherwise.
absl::Status CheckCudaRunnerDevice(int32_t device);

// The decode batch sizes that get a CUDA graph: 1, 2, 4, 8, then every 8 up to max_num_seqs (and
// max_num_seqs itself).
std::vector<int32_t> CudaGraphBatchSizes(int32_t max_num_seqs);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_RUNNER_CUDA_RUNNER_H_
