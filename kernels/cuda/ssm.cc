#include "kernels/cuda/ssm.h"

#include "common/status.h"
#include "common/strings.h"
#include "kernels/cuda/check.h"

namespace lmserve::kernels::cuda {
namespace {

absl::Status CheckSequences(const char* kernel, const SsmDeviceSequences& seqs) {
  if (seqs.num_seqs < 0 || seqs.num_slots < 0) {
    return KernelError(kernel, "negative sequence or slot count");
  }
  if (seqs.num_seqs > 0 && (seqs.query_start == nullptr || seqs.context_lens == nullptr ||
                            seqs.state_slots == nullptr)) {
    return KernelError(kernel, "null sequence arrays");
  }
  if (seqs.num_seqs > 65535) {
    return KernelError(kernel, StrCat(seqs.num_seqs, " sequences (at most 65535)"));
  }
  return absl::OkStatus();
}

}  // namespace

bool SupportsSsmStateSize(int64_t state_size) {
  return state_size == 16 || state_size == 32 || state_size == 64 || state_size == 128 ||
         state_size == 256;
}

absl::Status SsmConvParams::Validate() const {
  LMSERVE_RETURN_IF_ERROR(CheckSequences("SsmConv", seqs));
  LMSERVE_RETURN_IF_ERROR(CheckElementwiseDType("SsmConv", dtype));
  if (channels <= 0 || kernel < 2 || kernel > kSsmMaxConvKernel || input_stride < channels ||
      num_tokens < 0 || num_tokens > (int64_t{1} << 20)) {
    return KernelError("SsmConv", StrCat(channels, " channels, kernel ", kernel, ", input stride ",
                                         input_stride, " (kernel 2 to ", kSsmMaxConvKernel,
                                         ", stride at least the channels)"));
  }
  if (seqs.num_seqs > 0 &&
      (input == nullptr || weight == nullptr || output == nullptr || conv_states == nullptr)) {
    return KernelError("SsmConv", "null input, weight, output or states");
  }
  return absl::OkStatus();
}

absl::Status SsmScanParams::Validate() const {
  LMSERVE_RETURN_IF_ERROR(CheckSequences("SsmScan", seqs));
  LMSERVE_RETURN_IF_ERROR(CheckElementwiseDType("SsmScan", dtype));
  if (num_heads <= 0 || num_heads > 65535 || head_dim <= 0 || head_dim > kSsmMaxHeadDim ||
      head_dim % 8 != 0 ||
      !SupportsSsmStateSize(state_size) || n_groups <= 0 || num_heads % n_groups != 0) {
    return KernelError("SsmScan", StrCat(num_heads, " heads of ", head_dim, ", state ", state_size,
                                         ", ", n_groups, " groups (head_dim a multiple of 8, at most ",
                                         kSsmMaxHeadDim, "; state 16, 32, 64, 128 or 256; heads "
                                         "a multiple of the groups)"));
  }
  if (xbc_stride < num_heads * head_dim + 2 * n_groups * state_size || dt_stride < num_heads) {
    return KernelError("SsmScan", "row strides narrower than the rows");
  }
  if (seqs.num_seqs > 0 && (dt == nullptr || dt_bias == nullptr || a_log == nullptr ||
                            d == nullptr || output == nullptr || ssm_states == nullptr)) {
    return KernelError("SsmScan", "null input, parameter, output or states");
  }
  if (ssd_warps != 0 && ssd_warps != 4 && ssd_warps != 8) {
    return KernelError("SsmScan", StrCat("ssd_warps ", ssd_warps, " (0, 4 or 8)"));
  }
  return absl::OkStatus();
}

absl::Status SsmDecodeParams::Validate() const {
  SsmScanParams scan_shape = scan;
  if (scan_shape.xbc == nullptr) scan_shape.xbc = conv.input;  // not read: the conv's output is
  LMSERVE_RETURN_IF_ERROR(scan_shape.Validate());
  LMSERVE_RETURN_IF_ERROR(conv.Validate());
  if (conv.channels != scan.num_heads * scan.head_dim + 2 * scan.n_groups * scan.state_size ||
      conv.dtype != scan.dtype || conv.seqs.num_seqs != scan.seqs.num_seqs) {
    return KernelError("SsmDecode", "the conv's channels are not the scan's x, B and C");
  }
  if (norm.partials != nullptr &&
      (norm.gate == nullptr || norm.weight == nullptr ||
       norm.gate_stride < scan.num_heads * scan.head_dim)) {
    return KernelError("SsmDecode", StrCat("the gated norm needs a gate of stride at least ",
                                           scan.num_heads * scan.head_dim, " and a weight"));
  }
  return absl::OkStatus();
}

absl::Status SsmGatedRmsNormParams::Validate() const {
  LMSERVE_RETURN_IF_ERROR(CheckElementwiseDType("SsmGatedRmsNorm", dtype));
  if (num_tokens < 0 || width <= 0 || group_size <= 0 || width % group_size != 0 ||
      group_size > kSsmMaxNormGroup || gate_stride < width || !(epsilon > 0) ||
      width / group_size > 65535) {
    return KernelError("SsmGatedRmsNorm",
                       StrCat("width ", width, " in groups of ", group_size, ", gate stride ",
                              gate_stride, " (groups dividing the width, at most ",
                              kSsmMaxNormGroup, ", stride at least the width, epsilon > 0)"));
  }
  if (num_tokens > 0 &&
      (input == nullptr || gate == nullptr || weight == nullptr || output == nullptr)) {
    return KernelError("SsmGatedRmsNorm", "null input, gate, weight or output");
  }
  return absl::OkStatus();
}

}  // namespace lmserve::kernels::cuda
