#include "engine/model/ops.h"

namespace lmserve::engine {

int64_t BufferWidth(Buffer buffer, const ModelConfig& c) {
  const int64_t q_dim = c.num_attention_heads * c.head_dim;
  const int64_t kv_dim = c.num_kv_heads * c.head_dim;
  switch (buffer) {
    case Buffer::kResidual:
    case Buffer::kNormed:
    case Buffer::kProjected:
      return c.hidden_size;
    case Buffer::kQkv:
      return q_dim + 2 * kv_dim;
    case Buffer::kAttention:
      return q_dim;
    case Buffer::kActivation:
      return c.intermediate_size;
    case Buffer::kSsmIn:
      return c.ssm.num_heads > 0 ? c.ssm.in_proj_dim() : 0;
    case Buffer::kSsmConv:
      return c.ssm.num_heads > 0 ? c.ssm.conv_dim() : 0;
    case Buffer::kSsmOut:
      return c.ssm.num_heads > 0 ? c.ssm.inner() : 0;
  }
  return 0;
}

}  // namespace lmserve::engine
