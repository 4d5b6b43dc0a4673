// The Hopper prefill attention kernel (prefill_attention_sm90.cu, built for sm_90a alone), behind
// prefill_attention.h's Launch: internal to kernels/cuda.

#ifndef LMSERVE_KERNELS_CUDA_PREFILL_ATTENTION_SM90_H_
#define LMSERVE_KERNELS_CUDA_PREFILL_ATTENTION_SM90_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/prefill_attention.h"

namespace lmserve::kernels::cuda {

// Query rows of the sm_90a kernel's work items at every head dim: a tile of this many tokens of
// one head, or, with GQA packing (PrefillSm90Options::pack_gqa), of 128 / pack tokens of `pack`
// query heads that share a KV head (PrefillSm90TileTokens: the tile plan's rows when it runs).
constexpr int kPrefillSm90BlockRows = 128;
// PrefillSm90Options::persistent_short's bound on the batch's mean query length.
constexpr int kPrefillSm90ShortRows = 512;

// Whether the sm_90a kernel covers these (valid) params: head dim 64, 80, 96 or 128 (any window,
// soft-cap and cache type) or 256 (16-bit caches), a block size that is a multiple of 8 and
// divides the key tile (128 keys, 64 at head dim 256) or is a multiple of it. Host only; says
// nothing of the device.
bool PrefillSm90Supports(const PrefillAttentionParams& params);
// Whether the current device runs the sm_90a code (compute capability 9.0 and the kernel's code
// loads there). Cached per device.
bool PrefillSm90Available();
// Which consumer loop the kernel runs (process-wide; tests and the benchmark compare them). Head
// dim 256 runs kSerial whatever the choice.
enum class PrefillSm90Loop : uint8_t {
  kSerial,     // each tile's QK^T, softmax and PV in turn
  kPipelined,  // tile j's QK^T and softmax overlap tile j-1's PV (FlashAttention-3's
               // intra-warpgroup overlap)
  kPingpong,   // the default (fastest at every benchmarked shape on an H100): kPipelined, and
               // the two consumer groups take turns to issue their wgmmas (FlashAttention-3's
               // scheduler barrier between warpgroups)
};
void SetPrefillSm90Loop(PrefillSm90Loop loop);
// How the kernel runs (process-wide; the benchmark compares them and the tests run each). The
// defaults are the fastest measured (H100, bench/results/README.md section 16).
struct PrefillSm90Options {
  // A block a multiprocessor, each taking work items (a query tile of one head) in turn, so that
  // one item's loads overlap the last one's end, whatever the batch; else a block per item, but
  // as persistent_short says. On long prompts persistent blocks measured 5-13% slower (their
  // static round-robin share of items of unlike cost, and Q reloaded only once the last item's
  // QK^T is done).
  bool persistent = false;
  // Persistent blocks also where the batch's queries average at most kPrefillSm90ShortRows a
  // sequence (num_tokens <= kPrefillSm90ShortRows * num_seqs: short prompts, as serving's). Their
  // items are a few key tiles each, so a block an item spends much of its time starting and
  // ending, which a persistent block overlaps with its next item's loads; many items of like
  // cost also share out evenly. An H100, FP8 cache: 120 prompts of 128 tokens 208 us against
  // 301, 32 of 512 352 against 420; 4 of 1,024 177 against 156 (bench/results section 33).
  bool persistent_short = true;
  int max_blocks = 0;  // persistent: at most this many blocks (0: the multiprocessors; tests)
  bool heads_first = true;  // items' order: longest tiles first, heads fastest (else tiles fastest)
  bool paired = true;  // head dim 128: one TMA box for both 64-element columns of a cache block
  // GQA packing (FlashAttention-3's PackGQA): a work item takes the query heads of one KV head
  // together (up to 8, a power of two that divides the group), their rows token by token in its
  // 128 (token i's heads in rows i * pack ... i * pack + pack - 1), so that each K and V tile is
  // loaded once for all of them instead of once a head. It pays where items hold few tokens (a
  // few new tokens after a cached prefix: 3.4x at 4 a sequence on an H200) and is level on fresh
  // prompts, whose loads no longer bind (bench/results section 42).
  bool pack_gqa = true;
};
void SetPrefillSm90Options(const PrefillSm90Options& options);
// The query heads a work item of the sm_90a kernel takes for these params under the current
// options (1 without packing), and its tile's tokens, kPrefillSm90BlockRows / pack: the tile
// plan's rows. A plan computed under one setting of pack_gqa must not be run under another.
int PrefillSm90Pack(const PrefillAttentionParams& params);
int PrefillSm90TileTokens(const PrefillAttentionParams& params);
// REQUIRES: params valid, PrefillSm90Supports(params), the tile plan in params.workspace.
cudaError_t LaunchPrefillSm90(const PrefillAttentionParams& params, cudaStream_t stream);

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_PREFILL_ATTENTION_SM90_H_
