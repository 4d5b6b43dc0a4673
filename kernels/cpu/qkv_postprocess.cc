#include "kernels/cpu/qkv_postprocess.h"

#include <cmath>
#include <cstring>

#include "common/strings.h"
#include "kernels/cpu/check.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/paged_attention.h"

namespace lmserve::kernels {

absl::Status QkvPostProcessParams::Validate() const {
  if (num_tokens < 0 || num_heads <= 0 || num_kv_heads <= 0 || head_dim <= 0 ||
      head_dim % 2 != 0 || block_size <= 0 || num_blocks <= 0) {
    return absl::InvalidArgumentError(
        StrCat("QkvPostProcess: bad shape (tokens ", num_tokens, ", heads ", num_heads, ", kv heads ",
               num_kv_heads, ", head_dim ", head_dim, ", blocks ", num_blocks, " x ", block_size,
               ")"));
  }
  if (rotary_dim < 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim) {
    return absl::InvalidArgumentError(StrCat("QkvPostProcess: rotary_dim ", rotary_dim,
                                             " is not supported (even, at most head_dim ",
                                             head_dim, "; 0 for head_dim)"));
  }
  if (!(attention_factor > 0) || !std::isfinite(attention_factor)) {
    return absl::InvalidArgumentError(StrCat("QkvPostProcess: attention_factor ",
                                             attention_factor, " must be positive and finite"));
  }
  if ((q_norm == nullptr) != (k_norm == nullptr)) {
    return absl::InvalidArgumentError("QkvPostProcess: q_norm and k_norm come together");
  }
  if (q_norm != nullptr && !(norm_epsilon > 0)) {
    return absl::InvalidArgumentError("QkvPostProcess: norm_epsilon must be positive");
  }
  const int64_t row = (num_heads + 2 * num_kv_heads) * head_dim;
  if (qkv_stride != 0 && qkv_stride < row) {
    return absl::InvalidArgumentError("QkvPostProcess: qkv_stride is smaller than a row");
  }
  if (num_tokens == 0) return absl::OkStatus();
  if (qkv == nullptr || positions == nullptr || slot_mapping == nullptr || query_out == nullptr ||
      key_cache == nullptr || value_cache == nullptr) {
    return absl::InvalidArgumentError("QkvPostProcess: a null pointer");
  }
  const int64_t num_slots = num_blocks * block_size;
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (positions[t] < 0) {
      return absl::InvalidArgumentError(
          StrCat("QkvPostProcess: token ", t, " has negative position ", positions[t]));
    }
    if (slot_mapping[t] >= num_slots) {
      return absl::InvalidArgumentError(StrCat("QkvPostProcess: token ", t, " has slot ",
                                               slot_mapping[t], " outside [0, ", num_slots, ")"));
    }
  }
  return absl::OkStatus();
}

void QkvPostProcess(const QkvPostProcessParams& p) {
  CheckValid(p.Validate(), "QkvPostProcess");
  const int64_t q_width = p.num_heads * p.head_dim;
  const int64_t kv_width = p.num_kv_heads * p.head_dim;
  const int64_t row = q_width + 2 * kv_width;
  const int64_t stride = p.qkv_stride != 0 ? p.qkv_stride : row;
  // Bias-added copies of K and V; Q goes straight to query_out.
  std::vector<float> key(static_cast<size_t>(p.num_tokens * kv_width));
  std::vector<float> value(key.size());
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const float* src = p.qkv + t * stride;
    for (int64_t i = 0; i < row; ++i) {
      const float x = src[i] + (p.bias != nullptr ? p.bias[i] : 0.0f);
      if (i < q_width) {
        p.query_out[t * q_width + i] = x;
      } else if (i < q_width + kv_width) {
        key[t * kv_width + i - q_width] = x;
      } else {
        value[t * kv_width + i - q_width - kv_width] = x;
      }
    }
  }
  if (p.q_norm != nullptr) {
    HeadRmsNorm({.data = p.query_out,
                 .weight = p.q_norm,
                 .num_tokens = p.num_tokens,
                 .num_heads = p.num_heads,
                 .head_dim = p.head_dim,
                 .epsilon = p.norm_epsilon});
    HeadRmsNorm({.data = key.data(),
                 .weight = p.k_norm,
                 .num_tokens = p.num_tokens,
                 .num_heads = p.num_kv_heads,
                 .head_dim = p.head_dim,
                 .epsilon = p.norm_epsilon});
  }
  if (p.inv_freq != nullptr) {
    RotaryParams rotary;
    rotary.query = p.query_out;
    rotary.key = key.data();
    rotary.positions = p.positions;
    rotary.inv_freq = p.inv_freq;
    rotary.num_tokens = p.num_tokens;
    rotary.num_heads = p.num_heads;
    rotary.num_kv_heads = p.num_kv_heads;
    rotary.head_dim = p.head_dim;
    rotary.rotary_dim = p.rotary_dim;
    rotary.attention_factor = p.attention_factor;
    rotary.layout = p.layout;
    ApplyRotary(rotary);
  }
  // Tokens with a slot (negative slots are padding).
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    if (p.slot_mapping[t] < 0) continue;
    WriteKvCacheParams write;
    write.key = key.data() + t * kv_width;
    write.value = value.data() + t * kv_width;
    write.slot_mapping = p.slot_mapping + t;
    write.key_cache = p.key_cache;
    write.value_cache = p.value_cache;
    write.num_tokens = 1;
    write.num_kv_heads = p.num_kv_heads;
    write.head_dim = p.head_dim;
    write.block_size = p.block_size;
    write.num_blocks = p.num_blocks;
    WriteKvCache(write);
  }
}

std::vector<float> RotaryCosSinTable(const double* inv_freq, int64_t rotary_dim,
                                     int64_t max_position, double attention_factor) {
  const int64_t half = rotary_dim / 2;
  std::vector<float> table(static_cast<size_t>(max_position * rotary_dim));
  for (int64_t p = 0; p < max_position; ++p) {
    for (int64_t k = 0; k < half; ++k) {
      const double angle = static_cast<double>(p) * inv_freq[k];
      table[p * rotary_dim + k] = static_cast<float>(std::cos(angle) * attention_factor);
      table[p * rotary_dim + half + k] = static_cast<float>(std::sin(angle) * attention_factor);
    }
  }
  return table;
}

}  // namespace lmserve::kernels
