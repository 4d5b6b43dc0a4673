// State-space (Mamba-2) kernels on the GPU; the CPU twins are in kernels/cpu/ssm.h, which defines
// the math (conv1d with its rolling state, the SSD recurrence, the gated RMSNorm).
//
// Sequences as the CPU twins take them (SsmSequences), with the arrays in device memory (the
// runner's step inputs, so that CUDA graphs hold at any step): sequence i owns tokens
// [query_start[i], query_start[i+1]) and state slot state_slots[i]; a sequence whose step starts
// at position 0 (context_lens[i] equal to its token count) starts from zero state; a sequence of
// context 0 is padding (CUDA graphs' padded batches) and is skipped without reading its slot.
//
// States (fp32): the conv state of a slot is a ring of `kernel` rows [num_slots, kernel,
// channels], the input at position q in row q % kernel (the CPU twin keeps the last kernel - 1
// rows in order: the GPU's ring lets the decode kernel's blocks read positions q - kernel + 1 ..
// q - 1 while the block that owns a channel writes position q, with no race); the SSM state is
// [num_slots, num_heads, head_dim, state_size], as on the CPU.
//
// - SsmConv: the causal depthwise conv1d + SiLU over any step (prefill chunks, decodes): a
//   thread per (8 channels, sequence, 16 tokens), 16-byte loads and stores, the window slid in
//   registers so that each input is read once, SiLU with the fast exponential and division
//   (kernels of up to 4 taps, rows aligned to 8 elements: SsmConvUsesVectors); else (or
//   `scalar`) a thread per (channel, sequence, 16 tokens), each token's window read afresh.
//   Then a second kernel writes each sequence's last inputs into its ring.
// - SsmScan: the scan over any step. bf16 and fp16 (SsmScanUsesSsd: head_dim 64 with state 64 or
//   128, head_dim 32 with state 128 or 16, rows aligned to 8 elements): the chunked SSD form, one
//   block of 4 warps (or 8: ssd_warps) per (head, sequence), chunks of kSsdChunk tokens whose
//   intra-chunk products (C B^T masked by the decays, times x; C times the incoming state; the
//   chunk's contribution to the state, B^T times decay-weighted x) run on tensor cores with
//   16-bit operands and fp32 accumulation; the state is carried between chunks in fp32 (a
//   16-bit copy of it is the operand of C S^T), the decays in fp32. Else (fp32, other shapes, or
//   `recurrence`): the exact recurrence on the CUDA cores, in chunks of kScanChunk tokens staged
//   in shared memory (x, B, C, dt): one block per (sequence, head), 4 threads per head dim, each
//   holding state_size / 4 of its state row in registers.
// - SsmDecode: a decode-only step (one token a sequence, or padding) in one kernel: the conv
//   update of the head's x channels and its group's B and C channels, then the SSM update.
//   Blocks of 256 threads in two shapes: at small batches a block takes 16 rows of a head (16
//   lanes a state row, fewer for states under 64), so that one sequence spreads over hundreds of
//   blocks; at large batches (state 64 or more, at least 4 blocks a multiprocessor) 32 lanes a
//   row and 32 floats of state a thread (a whole head of 64 rows at state 128), so that the
//   group's B and C conv, which every block computes, is computed once a head. The state rows
//   and the conv taps of older positions are read before the kernel's programmatic-launch wait
//   (they overlap in_proj; in small blocks weighted there too, with the conv's weights), each
//   state byte read and written once; after the wait one round trip (the step's conv inputs and
//   dt) before the update. Optionally the gated RMSNorm's gating and weight too, its scale left
//   to out_proj (SsmDecodeGatedNorm).
// - GatedRmsNorm: one block per (token, norm group) of up to 1024 threads, 16-byte accesses
//   where rows are aligned, the gated values kept in shared memory between the reduction and
//   the write (a group of at most kSsmMaxNormGroup).
// bf16, fp16 or fp32 activations and weights; fp32 math and states.

#ifndef LMSERVE_KERNELS_CUDA_SSM_H_
#define LMSERVE_KERNELS_CUDA_SSM_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/dtype.h"

namespace lmserve::kernels::cuda {

struct SsmDeviceSequences {
  const int32_t* query_start = nullptr;   // [num_seqs + 1]; device
  const int32_t* context_lens = nullptr;  // [num_seqs]; device; 0: padding
  const int32_t* state_slots = nullptr;   // [num_seqs]; device; distinct, < num_slots
  int64_t num_seqs = 0;
  int64_t num_slots = 0;
};

// Shapes the kernels support.
inline constexpr int64_t kSsmMaxHeadDim = 256;    // head_dim * 4 threads a block
inline constexpr int64_t kSsmMaxConvKernel = 8;
inline constexpr int kScanChunk = 16;             // tokens staged at once by SsmScan
inline constexpr int64_t kSsmMaxNormGroup = 32768;  // gated RMSNorm: a group in shared memory
// state_size: 16, 32, 64, 128 or 256.
bool SupportsSsmStateSize(int64_t state_size);

struct SsmConvParams {
  SsmDeviceSequences seqs;
  const void* input = nullptr;   // [num_tokens, input_stride]: channels at [0, channels); device
  int64_t input_stride = 0;
  const void* weight = nullptr;  // [channels, kernel]; device
  const void* bias = nullptr;    // [channels]; device; null: none
  void* output = nullptr;        // [num_tokens, channels]; device
  float* conv_states = nullptr;  // [num_slots, kernel, channels] fp32 ring; device
  int64_t channels = 0;
  int64_t kernel = 0;  // 2 to kSsmMaxConvKernel
  DType dtype = DType::kBF16;  // of input, weight, bias and output
  // The step's tokens (an upper bound on any sequence's): the grid covers them. SsmDecode does
  // not read it.
  int64_t num_tokens = 0;
  // The one-channel-a-thread kernel even where the vectorized one would run (for A/B runs).
  bool scalar = false;

  absl::Status Validate() const;
};

// Whether Launch(SsmConvParams) runs the vectorized kernel.
bool SsmConvUsesVectors(const SsmConvParams& params);

struct SsmScanParams {
  SsmDeviceSequences seqs;
  const void* xbc = nullptr;  // [num_tokens, xbc_stride]: x, B, C (kernels/cpu/ssm.h); device
  int64_t xbc_stride = 0;
  const void* dt = nullptr;   // [num_tokens, dt_stride]: raw dt of each head; device
  int64_t dt_stride = 0;
  const void* dt_bias = nullptr;  // [num_heads]; device
  const void* a_log = nullptr;    // [num_heads]; device
  const void* d = nullptr;        // [num_heads]; device
  void* output = nullptr;         // [num_tokens, num_heads * head_dim]; device
  float* ssm_states = nullptr;    // [num_slots, num_heads, head_dim, state_size]; device
  int64_t num_heads = 0;
  int64_t head_dim = 0;    // at most kSsmMaxHeadDim
  int64_t state_size = 0;  // SupportsSsmStateSize
  int64_t n_groups = 1;
  float dt_min = 0.0f;
  float dt_max = 0.0f;  // 0: no upper bound
  DType dtype = DType::kBF16;  // of xbc, dt, the per-head weights and output
  // The CUDA-core recurrence even where the SSD kernel would run (for A/B runs).
  bool recurrence = false;
  // The SSD kernel's warps a block: 4 (3 blocks a multiprocessor) or 8 (2; C B^T computed twice
  // a block, fewer registers a thread); 0: the default (4).
  int ssd_warps = 0;

  absl::Status Validate() const;
};

// The SSD kernel's chunk: tokens whose products a block computes at once.
inline constexpr int kSsdChunk = 64;
// Whether Launch(SsmScanParams) runs the chunked SSD kernel (tensor cores) rather than the
// recurrence.
bool SsmScanUsesSsd(const SsmScanParams& params);

// A decode-only step: SsmConv and SsmScan of one token a sequence in one kernel. `scan.xbc` is
// not read (the conv's output stays in shared memory); `conv.input` is in_proj's x B C columns.
// REQUIRES: every sequence has one token or none (padding).
// The decode kernel's block shape (ssm.cu): kAuto picks by the batch; the others are for tests
// (kLarge where the shape does not allow it runs kSmall).
enum class SsmDecodeBlocks { kAuto, kSmall, kLarge };

// The gated RMSNorm folded into the decode kernel, for one norm group spanning the whole inner
// width: the kernel writes weight * v (v = y * silu(z), y rounded to the output type first, as
// the norm kernel reads it) instead of y, and partials[row * P + b] = the sum of v^2 over block
// b's rows of token row `row` (P = SsmDecodeNormPartials(params): the grid's blocks a sequence).
// The norm's scale, rsqrt(sum / width + epsilon), is left to the next product (skinny_gemm.h's
// norm epilogue), which sums the P partials of its row.
struct SsmDecodeGatedNorm {
  const void* gate = nullptr;  // z: [num_tokens, gate_stride], columns [0, inner); device
  int64_t gate_stride = 0;
  const void* weight = nullptr;  // [inner]; device
  float* partials = nullptr;     // [num_tokens, P]; device. Null: no norm (the plain y out)
};

struct SsmDecodeParams {
  SsmConvParams conv;
  SsmScanParams scan;
  SsmDecodeBlocks blocks = SsmDecodeBlocks::kAuto;
  SsmDecodeGatedNorm norm = {};
  // When the next kernel may launch (programmatic dependent launch): right after the wait (its
  // launch and weight loads overlap this kernel), or only once this kernel's stores are issued.
  bool late_dependents = false;

  absl::Status Validate() const;
};

// The decode kernel's blocks a sequence for `params` (its shape and the block shape it picks):
// the gated norm's partial sums a row.
int64_t SsmDecodeNormPartials(const SsmDecodeParams& params);

struct SsmGatedRmsNormParams {
  const void* input = nullptr;   // y: [num_tokens, width]; device
  const void* gate = nullptr;    // z: [num_tokens, gate_stride], columns [0, width); device
  int64_t gate_stride = 0;
  const void* weight = nullptr;  // [width]; device
  void* output = nullptr;        // [num_tokens, width]; device; may be input
  int64_t num_tokens = 0;
  int64_t width = 0;
  int64_t group_size = 0;  // divides width; at most kSsmMaxNormGroup
  float epsilon = 1e-5f;
  DType dtype = DType::kBF16;

  absl::Status Validate() const;
};

// Launchers: cudaErrorInvalidValue when Validate() fails, else the launch's error. Every kernel
// keeps the programmatic-launch contract (common.cuh).
cudaError_t Launch(const SsmConvParams& params, cudaStream_t stream);
cudaError_t Launch(const SsmScanParams& params, cudaStream_t stream);
cudaError_t Launch(const SsmDecodeParams& params, cudaStream_t stream);
cudaError_t Launch(const SsmGatedRmsNormParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_SSM_H_
