// The CPU model runner: the reference backend and the default one. It implements the forward ops
// (engine/model/ops.h) with the CPU kernels of kernels/cpu; the model's family says in which order.
//
// Weights (RunnerConfig::dtype): native (the default) keeps the matrices of the linear layers, the
// LM head and the embedding in the checkpoint's types where QuantLinear takes them (GGUF blocks,
// F16, BF16), part by part, and converts the rest (vectors, MoE experts) to fp32; float32 converts
// every declared tensor (the model's WeightPlan: Q/K/V fused into one matrix, gate/up into
// another) to fp32 (kernels::DequantizeToF32, whatever the file's type), so each projection takes
// one GEMM (OpenBLAS): the reference path. The KV cache is fp32, [num_blocks, block_size,
// num_kv_heads, head_dim] per layer for keys and for values, sized from
// RunnerConfig::kv_cache_bytes. Activations live in workspaces allocated once and grown only when
// a larger batch arrives; the final norm and lm_head run only on the rows that need logits.
//
// Threads: RunnerConfig::num_threads (0: one per physical core) for the step's parallel loops
// (kernels/cpu/parallel.h: matrix rows, attention items) and, in float32 mode, OpenBLAS's (which is
// process-wide); in native mode OpenBLAS runs single-threaded, only for what stays fp32.

#ifndef LMSERVE_ENGINE_RUNNER_CPU_RUNNER_H_
#define LMSERVE_ENGINE_RUNNER_CPU_RUNNER_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/model/checkpoint.h"
#include "engine/model/family.h"
#include "engine/runner/model_runner.h"

namespace lmserve::engine {

// Builds the CPU runner for `model`, its weights from `checkpoint` (ModelRunner::Create with
// Backend::kCpu lands here). Errors: an invalid RunnerConfig (RunnerDType::kBFloat16 included), a
// KV budget smaller than one block, a missing or misshapen tensor.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCpuRunner(
    std::unique_ptr<const ModelDescription> model, const Checkpoint& checkpoint,
    const RunnerConfig& config);

// Bytes of one KV block in the CPU runner: keys and values of the layers a block holds
// (KvLayersPerBlock: every layer, or one KV cache group's), fp32.
int64_t CpuKvBlockBytes(const ModelConfig& config, int32_t block_size_tokens);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_RUNNER_CPU_RUNNER_H_
