#include "kernels/cpu/ssm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/strings.h"
#include "kernels/cpu/check.h"
#include "kernels/cpu/parallel.h"

namespace lmserve::kernels {
namespace {

float Silu(float v) { return v / (1.0f + std::exp(-v)); }

// softplus as PyTorch computes it (threshold 20: beyond it, the identity).
double Softplus(double v) { return v > 20.0 ? v : std::log1p(std::exp(v)); }

double ClampDt(double dt, double dt_min, double dt_max) {
  dt = std::max(dt, dt_min);
  return dt_max > 0 ? std::min(dt, dt_max) : dt;
}

}  // namespace

absl::Status SsmSequences::Validate(const char* kernel) const {
  if (num_seqs < 0 || num_slots < 0) {
    return absl::InvalidArgumentError(StrCat(kernel, ": negative sequence or slot count"));
  }
  if (num_seqs == 0) return absl::OkStatus();
  if (query_start == nullptr || context_lens == nullptr || state_slots == nullptr) {
    return absl::InvalidArgumentError(StrCat(kernel, ": null sequence arrays"));
  }
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int32_t len = query_start[i + 1] - query_start[i];
    if (len < 0 || context_lens[i] < len) {
      return absl::InvalidArgumentError(StrCat(kernel, ": sequence ", i, " has ", len,
                                               " new tokens in a context of ", context_lens[i]));
    }
    if (state_slots[i] < 0 || state_slots[i] >= num_slots) {
      return absl::InvalidArgumentError(StrCat(kernel, ": sequence ", i, "'s state slot ",
                                               state_slots[i], " is not in [0, ", num_slots, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CausalConv1dParams::Validate() const {
  if (absl::Status s = seqs.Validate("CausalConv1d"); !s.ok()) return s;
  if (channels <= 0 || kernel < 1 || kernel > 8 || input_stride < channels) {
    return absl::InvalidArgumentError(StrCat("CausalConv1d: ", channels, " channels, kernel ",
                                             kernel, ", input stride ", input_stride,
                                             " (kernel 1 to 8, stride at least the channels)"));
  }
  if (seqs.num_seqs > 0 && (input == nullptr || weight == nullptr || output == nullptr ||
                            (kernel > 1 && conv_states == nullptr))) {
    return absl::InvalidArgumentError("CausalConv1d: null input, weight, output or states");
  }
  return absl::OkStatus();
}

void CausalConv1d(const CausalConv1dParams& p) {
  CheckValid(p.Validate(), "CausalConv1d");
  const int64_t k1 = p.kernel - 1, channels = p.channels;
  // Items: (sequence, block of channels).
  constexpr int64_t kChannelBlock = 64;
  const int64_t blocks = (channels + kChannelBlock - 1) / kChannelBlock;
  ParallelFor(p.seqs.num_seqs * blocks, p.num_threads, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / blocks;
      const int64_t c0 = (item % blocks) * kChannelBlock;
      const int64_t c1 = std::min(channels, c0 + kChannelBlock);
      const int64_t first = p.seqs.query_start[i];
      const int64_t len = p.seqs.query_start[i + 1] - first;
      float* state = p.conv_states + p.seqs.state_slots[i] * k1 * channels;
      const bool starts = p.seqs.Starts(i);
      // Input j of the sequence's window: j >= 0 the step's tokens, j < 0 the state.
      auto x = [&](int64_t j, int64_t c) -> float {
        if (j >= 0) return p.input[(first + j) * p.input_stride + c];
        return starts ? 0.0f : state[(k1 + j) * channels + c];
      };
      for (int64_t t = 0; t < len; ++t) {
        float* out = p.output + (first + t) * channels;
        for (int64_t c = c0; c < c1; ++c) {
          const float* w = p.weight + c * p.kernel;
          float acc = p.bias != nullptr ? p.bias[c] : 0.0f;
          for (int64_t k = 0; k < p.kernel; ++k) acc += w[k] * x(t - k1 + k, c);
          out[c] = Silu(acc);
        }
      }
      // The last k1 inputs; row r is input len - k1 + r, which for r ascending reads state rows
      // (len + r) not yet overwritten.
      for (int64_t r = 0; r < k1; ++r) {
        for (int64_t c = c0; c < c1; ++c) state[r * channels + c] = x(len - k1 + r, c);
      }
    }
  });
}

absl::Status SsmScanParams::Validate() const {
  if (absl::Status s = seqs.Validate("SsmScan"); !s.ok()) return s;
  if (num_heads <= 0 || head_dim <= 0 || state_size <= 0 || n_groups <= 0 ||
      num_heads % n_groups != 0 || chunk_size <= 0) {
    return absl::InvalidArgumentError(
        StrCat("SsmScan: ", num_heads, " heads of ", head_dim, ", state ", state_size, ", ",
               n_groups, " groups, chunk ", chunk_size,
               " (positive, heads a multiple of the groups)"));
  }
  if (xbc_stride < num_heads * head_dim + 2 * n_groups * state_size || dt_stride < num_heads) {
    return absl::InvalidArgumentError(StrCat("SsmScan: row strides ", xbc_stride, " and ",
                                             dt_stride, " are narrower than the rows"));
  }
  if (seqs.num_seqs > 0 && (xbc == nullptr || dt == nullptr || dt_bias == nullptr ||
                            a_log == nullptr || d == nullptr || output == nullptr ||
                            ssm_states == nullptr)) {
    return absl::InvalidArgumentError("SsmScan: null input, parameter, output or states");
  }
  return absl::OkStatus();
}

void SsmScan(const SsmScanParams& p) {
  CheckValid(p.Validate(), "SsmScan");
  const int64_t heads = p.num_heads, hd = p.head_dim, n = p.state_size;
  const int64_t inner = heads * hd, heads_per_group = heads / p.n_groups;
  const int64_t b_offset = inner, c_offset = inner + p.n_groups * n;
  ParallelFor(p.seqs.num_seqs * heads, p.num_threads, [&](int64_t begin, int64_t end) {
    // Sums and the state within a step in double: the state is rounded to fp32 only where the
    // step leaves it, so the chunking of a prompt changes its outputs by about an fp32 rounding.
    std::vector<double> dt, cum, scores, state_d;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / heads, h = item % heads, g = h / heads_per_group;
      const int64_t first = p.seqs.query_start[i];
      const int64_t len = p.seqs.query_start[i + 1] - first;
      float* state = p.ssm_states + (p.seqs.state_slots[i] * heads + h) * hd * n;  // [hd, n]
      if (p.seqs.Starts(i)) std::fill_n(state, hd * n, 0.0f);
      if (len == 0) continue;
      const double a = -std::exp(double{p.a_log[h]}), dh = p.d[h];
      auto x_row = [&](int64_t t) { return p.xbc + (first + t) * p.xbc_stride + h * hd; };
      auto b_row = [&](int64_t t) { return p.xbc + (first + t) * p.xbc_stride + b_offset + g * n; };
      auto c_row = [&](int64_t t) { return p.xbc + (first + t) * p.xbc_stride + c_offset + g * n; };
      auto dt_of = [&](int64_t t) -> double {
        return ClampDt(Softplus(p.dt[(first + t) * p.dt_stride + h] + p.dt_bias[h]), p.dt_min,
                       p.dt_max);
      };
      state_d.assign(state, state + hd * n);
      if (len == 1) {  // decode: the recurrence
        const double dt1 = dt_of(0), decay = std::exp(dt1 * a);
        const float* x = x_row(0);
        const float* bv = b_row(0);
        const float* cv = c_row(0);
        float* y = p.output + first * inner + h * hd;
        for (int64_t q = 0; q < hd; ++q) {
          double* s = state_d.data() + q * n;
          const double dx = dt1 * x[q];
          double acc = 0.0;
          for (int64_t k = 0; k < n; ++k) {
            s[k] = s[k] * decay + dx * bv[k];
            acc += s[k] * cv[k];
          }
          y[q] = static_cast<float>(acc + dh * x[q]);
        }
      } else {
        // Prefill: the SSD form chunk by chunk. Within a chunk of L tokens, with cum_t the sum of
        // dt_u A over u <= t in the chunk:
        //   y_t = exp(cum_t) state C_t + sum_{u <= t} exp(cum_t - cum_u) dt_u (C_t . B_u) x_u
        //         + D x_t
        //   state' = exp(cum_{L-1}) state + sum_u exp(cum_{L-1} - cum_u) dt_u x_u B_u^T
        for (int64_t c0 = 0; c0 < len; c0 += p.chunk_size) {
          const int64_t l = std::min(p.chunk_size, len - c0);
          dt.resize(static_cast<size_t>(l));
          cum.resize(static_cast<size_t>(l));
          scores.resize(static_cast<size_t>(l));
          double running = 0.0;
          for (int64_t t = 0; t < l; ++t) {
            dt[t] = dt_of(c0 + t);
            running += dt[t] * a;
            cum[t] = running;
          }
          for (int64_t t = 0; t < l; ++t) {
            const float* cv = c_row(c0 + t);
            for (int64_t u = 0; u <= t; ++u) {
              const float* bv = b_row(c0 + u);
              double dot = 0.0;
              for (int64_t k = 0; k < n; ++k) dot += double{cv[k]} * bv[k];
              scores[u] = std::exp(cum[t] - cum[u]) * dt[u] * dot;
            }
            const double state_decay = std::exp(cum[t]);
            const float* xt = x_row(c0 + t);
            float* y = p.output + (first + c0 + t) * inner + h * hd;
            for (int64_t q = 0; q < hd; ++q) {
              const double* s = state_d.data() + q * n;
              double from_state = 0.0;
              for (int64_t k = 0; k < n; ++k) from_state += s[k] * cv[k];
              double within = 0.0;
              for (int64_t u = 0; u <= t; ++u) within += scores[u] * x_row(c0 + u)[q];
              y[q] = static_cast<float>(state_decay * from_state + within + dh * xt[q]);
            }
          }
          // The state after the chunk.
          const double chunk_decay = std::exp(cum[l - 1]);
          for (int64_t u = 0; u < l; ++u) scores[u] = std::exp(cum[l - 1] - cum[u]) * dt[u];
          for (int64_t q = 0; q < hd; ++q) {
            double* s = state_d.data() + q * n;
            for (int64_t k = 0; k < n; ++k) s[k] *= chunk_decay;
            for (int64_t u = 0; u < l; ++u) {
              const double w = scores[u] * x_row(c0 + u)[q];
              const float* bv = b_row(c0 + u);
              for (int64_t k = 0; k < n; ++k) s[k] += w * bv[k];
            }
          }
        }
      }
      for (int64_t k = 0; k < hd * n; ++k) state[k] = static_cast<float>(state_d[k]);
    }
  });
}

absl::Status GatedRmsNormParams::Validate() const {
  if (num_tokens < 0 || width <= 0 || group_size <= 0 || width % group_size != 0 ||
      gate_stride < width || !(epsilon > 0)) {
    return absl::InvalidArgumentError(
        StrCat("GatedRmsNorm: width ", width, " in groups of ", group_size, ", gate stride ",
               gate_stride, " (groups dividing the width, stride at least the width, epsilon > 0)"));
  }
  if (num_tokens > 0 &&
      (input == nullptr || gate == nullptr || weight == nullptr || output == nullptr)) {
    return absl::InvalidArgumentError("GatedRmsNorm: null input, gate, weight or output");
  }
  return absl::OkStatus();
}

void GatedRmsNorm(const GatedRmsNormParams& p) {
  CheckValid(p.Validate(), "GatedRmsNorm");
  std::vector<float> v(static_cast<size_t>(p.group_size));
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    for (int64_t g0 = 0; g0 < p.width; g0 += p.group_size) {
      const float* y = p.input + t * p.width + g0;
      const float* z = p.gate + t * p.gate_stride + g0;
      double sum = 0;
      for (int64_t k = 0; k < p.group_size; ++k) {
        v[k] = y[k] * Silu(z[k]);
        sum += double{v[k]} * v[k];
      }
      const float scale =
          static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(p.group_size) + p.epsilon));
      float* out = p.output + t * p.width + g0;
      for (int64_t k = 0; k < p.group_size; ++k) out[k] = p.weight[g0 + k] * (v[k] * scale);
    }
  }
}

}  // namespace lmserve::kernels
