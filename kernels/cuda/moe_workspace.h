// The mixture-of-experts kernels' workspace (moe.h): where each array lies, for one pass of up to
// `chunk_tokens` tokens. Shared by the launcher (moe.cu) and WorkspaceBytes (moe.cc).

#ifndef LMSERVE_KERNELS_CUDA_MOE_WORKSPACE_H_
#define LMSERVE_KERNELS_CUDA_MOE_WORKSPACE_H_

#include <cstdint>

namespace lmserve::kernels::cuda {

struct MoeWorkspaceLayout {
  int64_t logits = 0;        // float [chunk_tokens, num_experts]: router logits
  int64_t expert_ids = 0;    // int32 [slots]: slot s = token * top_k + k
  int64_t weights = 0;       // float [slots]
  int64_t offsets = 0;       // int32 [num_experts + 1]: expert e's rows in sorted order
  int64_t tile_offsets = 0;  // int32 [num_experts + 1]: expert e's first tile; the last: all
  int64_t sorted_slots = 0;  // int32 [slots]: the slot of each sorted row
  int64_t slot_rows = 0;     // int32 [slots]: the sorted row of each slot
  int64_t act = 0;           // T [slots, intermediate]: by sorted row (grouped) or slot (fused)
  int64_t expert_out = 0;    // T [slots, hidden]: by sorted row (grouped)
  int64_t total = 0;

  static MoeWorkspaceLayout For(int64_t chunk_tokens, int64_t num_experts, int64_t top_k,
                                int64_t hidden, int64_t intermediate, int64_t element_bytes) {
    MoeWorkspaceLayout l;
    const int64_t slots = chunk_tokens * top_k;
    auto take = [&l](int64_t bytes) {
      const int64_t at = l.total;
      l.total += (bytes + 255) / 256 * 256;
      return at;
    };
    l.logits = take(chunk_tokens * num_experts * 4);
    l.expert_ids = take(slots * 4);
    l.weights = take(slots * 4);
    l.offsets = take((num_experts + 1) * 4);
    l.tile_offsets = take((num_experts + 1) * 4);
    l.sorted_slots = take(slots * 4);
    l.slot_rows = take(slots * 4);
    l.act = take(slots * intermediate * element_bytes);
    l.expert_out = take(slots * hidden * element_bytes);
    return l;
  }
};

}  // namespace lmserve::kernels::cuda

#endif  // LMSERVE_KERNELS_CUDA_MOE_WORKSPACE_H_
