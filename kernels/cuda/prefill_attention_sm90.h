// The Hopper prefill attention kernel (prefill_attention_sm90.cu, built for sm_90a alone), behind
// prefill_attention.h's Launch: internal to kernels/cuda.

#ifndef LMSERVE_KERNELS_CUDA_PREFILL_ATTENTION_SM90_H_
#define LMSERVE_KERNELS_CUDA_PREFILL_ATTENTION_SM90_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/prefill_attention.h"

namespace lmserve::kernels::cuda {

// Whether the sm_90a kernel covers these (valid) params: head dim 64 or 128, no window, no
// soft-cap, a block size that is a multiple of 8 and divides 128 or is a multiple of it. Host
// only; says nothing of the device.
bool PrefillSm90Supports(const PrefillAttentionParams& params);
// Whether the current device runs the sm_90a code (compute capability 9.0 and the kernel's code
// loads there). Cached per device.
bool PrefillSm90Available();
// Which consumer loop the kernel runs (process-wide; tests and the benchmark compare them).
enum class PrefillSm90Loop : uint8_t {
  kSerial,     // each tile's QK^T, softmax and PV in turn
  kPipelined,  // tile j's QK^T and softmax overlap tile j-1's PV (FlashAttention-3's
               // intra-warpgroup overlap)
  kPingpong,   // the default (fastest at every benchmarked shape on an H100): kPipelined, and
               // the two consumer groups take turns to issue their wgmmas (FlashAttention-3's
               // scheduler barrier between warpgroups)
};
void SetPrefillSm90Loop(PrefillSm90Loop loop);
// Variants of the kernel for the benchmark's comparison rows and the tests (process-wide). The
// default is persistent: a block a multiprocessor, each taking work items (a query tile of one
// head) in turn, longest first, heads fastest, so that one item's loads overlap the last one's
// end. kTwoStages, kContiguousBoxes and kNoExp change the ping-pong loop's bf16 kernel only;
// those marked "timing only" compute wrong outputs: each takes one cost away to show what it
// costs.
enum class PrefillSm90Variant : uint8_t {
  kDefault,
  kOneItemPerBlock,  // a block per work item (the grid walks them in the default's order)
  kTilesFirst,       // a block per work item, tiles fastest (one head's tiles side by side)
  kFewBlocks,        // persistent on 3 blocks: many items a block even for small shapes (tests)
  kTwoStages,        // a K/V ring of two stages
  kContiguousBoxes,  // timing only: one TMA box of 128 cache slots per column and tile, whatever
                     // the block size
  kNoExp,            // timing only: the softmax without its exponentials
};
void SetPrefillSm90Variant(PrefillSm90Variant variant);
// REQUIRES: params valid, PrefillSm90Supports(params), the tile plan in params.workspace.
cudaError_t LaunchPrefillSm90(const PrefillAttentionParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_PREFILL_ATTENTION_SM90_H_
