// The state-space kernels (kernels/cuda/ssm.h) against their CPU twins (kernels/cpu/ssm.h), in
// fp32 and bf16: three steps of three sequences in awkward slots — prefills of 1, 17 and 97 tokens
// from zero state, then chunks of 1, 5 and 33 tokens continuing from the states the first step
// left, then a decode step through the fused conv + SSM update kernel — with fresh random inputs
// and poisoned outputs. The conv states are laid out differently (a ring on the GPU), so they are
// compared through the outputs of the later steps; the SSM states directly after each step.
// Bounds: relative L2 1e-5 in fp32 (the CPU twin's scan sums in double, the GPU's in fp32, over
// at most 130 steps of a decaying recurrence), the output rounding (1e-2) in bf16.

#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/ssm.h"
#include "kernels/cuda/skinny_gemm.h"
#include "kernels/cuda/ssm.h"
#include "tests/kernels_gpu/gpu_test_util.h"

namespace lmserve::kernels::cuda {
namespace {

using testing::DeviceBuffer;
using testing::Download;
using testing::FreshSeed;
using testing::Poisoned;
using testing::RandomFloats;
using testing::RelativeL2;
using testing::Upload;

constexpr int64_t kHeads = 6, kHeadDim = 16, kState = 32, kGroups = 2, kKernel = 4, kSlots = 5;
constexpr int64_t kInner = kHeads * kHeadDim;
constexpr int64_t kConvDim = kInner + 2 * kGroups * kState;
constexpr int64_t kInProj = kInner + kConvDim + kHeads;

struct Step {
  std::vector<int32_t> lens;
  std::vector<int32_t> context_lens;
};

// The heads of a layer: the state size and head dim choose the decode kernel's lanes a state row
// (4, 8 or 16) and rows a block.
struct HeadShape {
  int64_t heads, head_dim, state, groups;
};

void CheckThreeSteps(const HeadShape& shape, SsmDecodeBlocks blocks) {
  const int64_t kHeads = shape.heads, kHeadDim = shape.head_dim, kState = shape.state,
                kGroups = shape.groups;
  const int64_t kInner = kHeads * kHeadDim;
  const int64_t kConvDim = kInner + 2 * kGroups * kState;
  const int64_t kInProj = kInner + kConvDim + kHeads;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << testing::Name(dtype) << " heads " << kHeads << " x " << kHeadDim << ", state "
                 << kState << ", groups " << kGroups << ", decode blocks "
                 << (blocks == SsmDecodeBlocks::kLarge ? "large" : "small") << ", seed " << seed);
    std::mt19937 rng(seed);
    std::vector<float> conv_w = RandomFloats(kConvDim * kKernel, rng, 0.5f);
    std::vector<float> conv_b = RandomFloats(kConvDim, rng, 0.1f);
    std::vector<float> dt_bias = RandomFloats(kHeads, rng, 0.5f, -1.0f);
    std::vector<float> a_log = RandomFloats(kHeads, rng, 0.5f);
    std::vector<float> d = RandomFloats(kHeads, rng, 1.0f);
    DeviceBuffer<uint8_t> d_conv_w = Upload(conv_w, dtype), d_conv_b = Upload(conv_b, dtype),
                          d_dt_bias = Upload(dt_bias, dtype), d_a_log = Upload(a_log, dtype),
                          d_d = Upload(d, dtype);
    const std::vector<int32_t> slots = {3, 0, 4};
    DeviceBuffer<int32_t> d_slots(slots);
    // CPU states (its layout) and GPU states (rings); both start as garbage the kernels ignore
    // for sequences that start.
    std::vector<float> cpu_conv(kSlots * (kKernel - 1) * kConvDim, 7.0f);
    std::vector<float> cpu_ssm(kSlots * kHeads * kHeadDim * kState, 7.0f);
    DeviceBuffer<float> gpu_conv(static_cast<size_t>(kSlots * kKernel * kConvDim));
    DeviceBuffer<float> gpu_ssm(cpu_ssm);
    gpu_conv.Poison(0x40);  // 3.0: not NaN, so that a wrongly read state shows as a wrong value
    const Step steps[] = {{{1, 17, 97}, {1, 17, 97}}, {{1, 5, 33}, {2, 22, 130}},
                          {{1, 1, 1}, {3, 23, 131}}};
    for (size_t k = 0; k < 3; ++k) {
      const Step& step = steps[k];
      SCOPED_TRACE(::testing::Message() << "step " << k);
      std::vector<int32_t> query_start = {0};
      for (int32_t len : step.lens) query_start.push_back(query_start.back() + len);
      const int64_t tokens = query_start.back();
      std::vector<float> in = RandomFloats(tokens * kInProj, rng);
      DeviceBuffer<uint8_t> d_in = Upload(in, dtype);
      DeviceBuffer<int32_t> d_query_start(query_start), d_context(step.context_lens);
      const SsmSequences cpu_seqs{.query_start = query_start.data(),
                                  .context_lens = step.context_lens.data(),
                                  .state_slots = slots.data(),
                                  .num_seqs = 3,
                                  .num_slots = kSlots};
      const SsmDeviceSequences gpu_seqs{.query_start = d_query_start.get(),
                                        .context_lens = d_context.get(),
                                        .state_slots = d_slots.get(),
                                        .num_seqs = 3,
                                        .num_slots = kSlots};
      // CPU: conv, then scan.
      std::vector<float> cpu_xbc(tokens * kConvDim), cpu_y(tokens * kInner);
      kernels::CausalConv1d({.seqs = cpu_seqs,
                             .input = in.data() + kInner,
                             .input_stride = kInProj,
                             .weight = conv_w.data(),
                             .bias = conv_b.data(),
                             .output = cpu_xbc.data(),
                             .conv_states = cpu_conv.data(),
                             .channels = kConvDim,
                             .kernel = kKernel});
      if (dtype != DType::kF32) testing::RoundToHalf(cpu_xbc, dtype);  // as the GPU stores it
      kernels::SsmScan({.seqs = cpu_seqs,
                        .xbc = cpu_xbc.data(),
                        .xbc_stride = kConvDim,
                        .dt = in.data() + kInner + kConvDim,
                        .dt_stride = kInProj,
                        .dt_bias = dt_bias.data(),
                        .a_log = a_log.data(),
                        .d = d.data(),
                        .output = cpu_y.data(),
                        .ssm_states = cpu_ssm.data(),
                        .num_heads = kHeads,
                        .head_dim = kHeadDim,
                        .state_size = kState,
                        .n_groups = kGroups,
                        .chunk_size = 8});
      // GPU.
      DeviceBuffer<uint8_t> d_xbc = Poisoned(tokens * kConvDim, dtype);
      DeviceBuffer<uint8_t> d_y = Poisoned(tokens * kInner, dtype);
      const SsmConvParams conv{
          .seqs = gpu_seqs,
          .input = d_in.get() + kInner * testing::ElementBytes(dtype),
          .input_stride = kInProj,
          .weight = d_conv_w.get(),
          .bias = d_conv_b.get(),
          .output = d_xbc.get(),
          .conv_states = gpu_conv.get(),
          .channels = kConvDim,
          .kernel = kKernel,
          .dtype = dtype,
          .num_tokens = tokens};
      const SsmScanParams scan{
          .seqs = gpu_seqs,
          .xbc = d_xbc.get(),
          .xbc_stride = kConvDim,
          .dt = d_in.get() + (kInner + kConvDim) * testing::ElementBytes(dtype),
          .dt_stride = kInProj,
          .dt_bias = d_dt_bias.get(),
          .a_log = d_a_log.get(),
          .d = d_d.get(),
          .output = d_y.get(),
          .ssm_states = gpu_ssm.get(),
          .num_heads = kHeads,
          .head_dim = kHeadDim,
          .state_size = kState,
          .n_groups = kGroups,
          .dtype = dtype};
      if (k < 2) {
        CUDA_ASSERT(Launch(conv, nullptr));
        CUDA_ASSERT(Launch(scan, nullptr));
      } else {
        CUDA_ASSERT(Launch(SsmDecodeParams{.conv = conv, .scan = scan, .blocks = blocks}, nullptr));
      }
      CUDA_ASSERT(cudaDeviceSynchronize());
      const double tolerance = dtype == DType::kF32 ? 1e-5 : 1e-2;
      if (k < 2) {
        EXPECT_LE(RelativeL2(Download(d_xbc, dtype), cpu_xbc), tolerance) << "conv";
      }
      EXPECT_LE(RelativeL2(Download(d_y, dtype), cpu_y), tolerance) << "scan output";
      // The SSM states of the three slots (the others are untouched: 7.0 on both).
      EXPECT_LE(RelativeL2(gpu_ssm.Download(), cpu_ssm), dtype == DType::kF32 ? 1e-5 : 2e-2)
          << "SSM states";
    }
  }
}

TEST(SsmGpuTest, ConvScanAndDecodeMatchTheCpuOverThreeSteps) {
  LMSERVE_REQUIRE_GPU();
  // The decode kernel's small blocks: the file's shape (8 lanes a row, 32 rows a block, 16 of
  // them past head_dim); Mamba-2-2.7B's heads (16 lanes, 16 rows, two float4s a lane); 4 lanes
  // and 64 rows (56 past head_dim); state 256 (four float4s a lane). Its large blocks (32 lanes
  // a row, 32 floats a thread), which need state 64 or more and head_dim a multiple of the rows:
  // Mamba-2-2.7B's heads (8 rows a group, one head a block), state 256 (4 rows a group, 32 a
  // block, a head of 32).
  for (const HeadShape& shape :
       {HeadShape{kHeads, kHeadDim, kState, kGroups}, HeadShape{4, 64, 128, 1},
        HeadShape{2, 8, 16, 1}, HeadShape{4, 32, 256, 2}}) {
    CheckThreeSteps(shape, SsmDecodeBlocks::kSmall);
  }
  for (const HeadShape& shape : {HeadShape{4, 64, 128, 1}, HeadShape{4, 32, 256, 2}}) {
    CheckThreeSteps(shape, SsmDecodeBlocks::kLarge);
  }
}

// Padding sequences (context 0, as CUDA graphs pad a decode batch) read and write nothing.
TEST(SsmGpuTest, DecodeSkipsPaddingSequences) {
  LMSERVE_REQUIRE_GPU();
  std::mt19937 rng(FreshSeed());
  std::vector<float> in = RandomFloats(2 * kInProj, rng);
  std::vector<float> conv_w = RandomFloats(kConvDim * kKernel, rng);
  std::vector<float> heads = RandomFloats(kHeads, rng);
  DeviceBuffer<uint8_t> d_in = Upload(in, DType::kF32), d_w = Upload(conv_w, DType::kF32),
                        d_heads = Upload(heads, DType::kF32);
  const std::vector<int32_t> query_start = {0, 1, 2}, context = {0, 0}, slots = {1, 1};
  DeviceBuffer<int32_t> d_qs(query_start), d_ctx(context), d_slots(slots);
  DeviceBuffer<float> conv_states(static_cast<size_t>(2 * kKernel * kConvDim));
  DeviceBuffer<float> ssm_states(static_cast<size_t>(2 * kHeads * kHeadDim * kState));
  conv_states.Poison(0x11);
  ssm_states.Poison(0x11);
  const std::vector<float> conv_before = conv_states.Download(), ssm_before = ssm_states.Download();
  DeviceBuffer<uint8_t> y = Poisoned(2 * kInner, DType::kF32);
  const SsmDeviceSequences seqs{.query_start = d_qs.get(),
                                .context_lens = d_ctx.get(),
                                .state_slots = d_slots.get(),
                                .num_seqs = 2,
                                .num_slots = 2};
  const SsmDecodeParams decode{
      .conv = {.seqs = seqs,
               .input = d_in.get() + kInner * 4,
               .input_stride = kInProj,
               .weight = d_w.get(),
               .output = nullptr,
               .conv_states = conv_states.get(),
               .channels = kConvDim,
               .kernel = kKernel,
               .dtype = DType::kF32},
      .scan = {.seqs = seqs,
               .xbc_stride = kConvDim,
               .dt = d_in.get() + (kInner + kConvDim) * 4,
               .dt_stride = kInProj,
               .dt_bias = d_heads.get(),
               .a_log = d_heads.get(),
               .d = d_heads.get(),
               .output = y.get(),
               .ssm_states = ssm_states.get(),
               .num_heads = kHeads,
               .head_dim = kHeadDim,
               .state_size = kState,
               .n_groups = kGroups,
               .dtype = DType::kF32}};
  // The decode kernel writes no conv output: Validate asks for one anyway (any address).
  SsmDecodeParams with_output = decode;
  with_output.conv.output = y.get();
  with_output.scan.xbc = d_in.get();
  CUDA_ASSERT(Launch(with_output, nullptr));
  CUDA_ASSERT(cudaDeviceSynchronize());
  EXPECT_TRUE(testing::SameValues(conv_states.Download(), conv_before));
  EXPECT_TRUE(testing::SameValues(ssm_states.Download(), ssm_before));
}

TEST(SsmGpuTest, GatedRmsNormMatchesTheCpu) {
  LMSERVE_REQUIRE_GPU();
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t groups : {1, 4}) {
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message() << testing::Name(dtype) << " groups " << groups
                                        << " seed " << seed);
      std::mt19937 rng(seed);
      // Gate stride 700: element by element; 704: 16-byte vectors (every row aligned).
      for (int64_t stride : {700, 704}) {
        SCOPED_TRACE(::testing::Message() << "gate stride " << stride);
        const int64_t tokens = 17, width = 320;
        std::vector<float> y = RandomFloats(tokens * width, rng);
        std::vector<float> z = RandomFloats(tokens * stride, rng);
        std::vector<float> w = RandomFloats(width, rng, 0.1f, 1.0f);
        DeviceBuffer<uint8_t> d_y = Upload(y, dtype), d_z = Upload(z, dtype),
                              d_w = Upload(w, dtype);
        DeviceBuffer<uint8_t> d_out = Poisoned(tokens * width, dtype);
        std::vector<float> want(tokens * width);
        kernels::GatedRmsNorm({.input = y.data(),
                               .gate = z.data(),
                               .gate_stride = stride,
                               .weight = w.data(),
                               .output = want.data(),
                               .num_tokens = tokens,
                               .width = width,
                               .group_size = width / groups,
                               .epsilon = 1e-5});
        CUDA_ASSERT(Launch(SsmGatedRmsNormParams{.input = d_y.get(),
                                                 .gate = d_z.get(),
                                                 .gate_stride = stride,
                                                 .weight = d_w.get(),
                                                 .output = d_out.get(),
                                                 .num_tokens = tokens,
                                                 .width = width,
                                                 .group_size = width / groups,
                                                 .epsilon = 1e-5f,
                                                 .dtype = dtype},
                           nullptr));
        CUDA_ASSERT(cudaDeviceSynchronize());
        EXPECT_LE(RelativeL2(Download(d_out, dtype), want), testing::Tolerance(dtype));
      }
    }
  }
}

// The decode kernel with the gated RMSNorm folded in (its gating and weight; SsmDecodeGatedNorm)
// and the skinny GEMM's norm epilogue (its scale) as out_proj, against the CPU twins' conv,
// scan, gated norm and linear layer: a prefill of 9 tokens (the separate kernels), then a decode
// step of one token in bf16. Bound: 2e-2 relative L2 (bf16 roundings of y, the gated values and
// the product, which the unfused path rounds in other places).
void CheckDecodeWithGatedNorm(const HeadShape& shape, SsmDecodeBlocks blocks) {
  const DType dtype = DType::kBF16;
  const int64_t heads = shape.heads, head_dim = shape.head_dim, state = shape.state,
                groups = shape.groups;
  const int64_t inner = heads * head_dim, conv_dim = inner + 2 * groups * state;
  const int64_t in_proj = inner + conv_dim + heads, out_features = 136;
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "heads " << heads << " x " << head_dim << ", state "
                                    << state << ", decode blocks "
                                    << (blocks == SsmDecodeBlocks::kLarge ? "large" : "small")
                                    << ", seed " << seed);
  std::mt19937 rng(seed);
  std::vector<float> conv_w = RandomFloats(conv_dim * kKernel, rng, 0.5f);
  std::vector<float> conv_b = RandomFloats(conv_dim, rng, 0.1f);
  std::vector<float> dt_bias = RandomFloats(heads, rng, 0.5f, -1.0f);
  std::vector<float> a_log = RandomFloats(heads, rng, 0.5f);
  std::vector<float> d = RandomFloats(heads, rng, 1.0f);
  std::vector<float> norm_w = RandomFloats(inner, rng, 0.2f, 1.0f);
  std::vector<float> out_w = RandomFloats(out_features * inner, rng, 0.1f);
  DeviceBuffer<uint8_t> d_conv_w = Upload(conv_w, dtype), d_conv_b = Upload(conv_b, dtype),
                        d_dt_bias = Upload(dt_bias, dtype), d_a_log = Upload(a_log, dtype),
                        d_d = Upload(d, dtype), d_norm_w = Upload(norm_w, dtype),
                        d_out_w = Upload(out_w, dtype);
  const std::vector<int32_t> slots = {2};
  DeviceBuffer<int32_t> d_slots(slots);
  std::vector<float> cpu_conv(kSlots * (kKernel - 1) * conv_dim, 7.0f);
  std::vector<float> cpu_ssm(kSlots * heads * head_dim * state, 7.0f);
  DeviceBuffer<float> gpu_conv(static_cast<size_t>(kSlots * kKernel * conv_dim));
  DeviceBuffer<float> gpu_ssm(cpu_ssm);
  gpu_conv.Poison(0x40);
  for (int32_t step : {0, 1}) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    const int32_t len = step == 0 ? 9 : 1;
    const std::vector<int32_t> query_start = {0, len}, context = {step == 0 ? 9 : 10};
    std::vector<float> in = RandomFloats(len * in_proj, rng);
    DeviceBuffer<uint8_t> d_in = Upload(in, dtype);  // rounds `in` too
    DeviceBuffer<int32_t> d_query_start(query_start), d_context(context);
    const SsmSequences cpu_seqs{.query_start = query_start.data(),
                                .context_lens = context.data(),
                                .state_slots = slots.data(),
                                .num_seqs = 1,
                                .num_slots = kSlots};
    const SsmDeviceSequences gpu_seqs{.query_start = d_query_start.get(),
                                      .context_lens = d_context.get(),
                                      .state_slots = d_slots.get(),
                                      .num_seqs = 1,
                                      .num_slots = kSlots};
    std::vector<float> cpu_xbc(len * conv_dim), cpu_y(len * inner);
    kernels::CausalConv1d({.seqs = cpu_seqs,
                           .input = in.data() + inner,
                           .input_stride = in_proj,
                           .weight = conv_w.data(),
                           .bias = conv_b.data(),
                           .output = cpu_xbc.data(),
                           .conv_states = cpu_conv.data(),
                           .channels = conv_dim,
                           .kernel = kKernel});
    testing::RoundToHalf(cpu_xbc, dtype);
    kernels::SsmScan({.seqs = cpu_seqs,
                      .xbc = cpu_xbc.data(),
                      .xbc_stride = conv_dim,
                      .dt = in.data() + inner + conv_dim,
                      .dt_stride = in_proj,
                      .dt_bias = dt_bias.data(),
                      .a_log = a_log.data(),
                      .d = d.data(),
                      .output = cpu_y.data(),
                      .ssm_states = cpu_ssm.data(),
                      .num_heads = heads,
                      .head_dim = head_dim,
                      .state_size = state,
                      .n_groups = groups,
                      .chunk_size = 8});
    DeviceBuffer<uint8_t> d_xbc = Poisoned(len * conv_dim, dtype);
    DeviceBuffer<uint8_t> d_y = Poisoned(len * inner, dtype);
    const SsmConvParams conv{.seqs = gpu_seqs,
                             .input = d_in.get() + inner * 2,
                             .input_stride = in_proj,
                             .weight = d_conv_w.get(),
                             .bias = d_conv_b.get(),
                             .output = d_xbc.get(),
                             .conv_states = gpu_conv.get(),
                             .channels = conv_dim,
                             .kernel = kKernel,
                             .dtype = dtype,
                             .num_tokens = len};
    const SsmScanParams scan{.seqs = gpu_seqs,
                             .xbc = d_xbc.get(),
                             .xbc_stride = conv_dim,
                             .dt = d_in.get() + (inner + conv_dim) * 2,
                             .dt_stride = in_proj,
                             .dt_bias = d_dt_bias.get(),
                             .a_log = d_a_log.get(),
                             .d = d_d.get(),
                             .output = d_y.get(),
                             .ssm_states = gpu_ssm.get(),
                             .num_heads = heads,
                             .head_dim = head_dim,
                             .state_size = state,
                             .n_groups = groups,
                             .dtype = dtype};
    if (step == 0) {
      CUDA_ASSERT(Launch(conv, nullptr));
      CUDA_ASSERT(Launch(scan, nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      continue;
    }
    // The CPU's gated norm and out_proj.
    std::vector<float> cpu_normed(inner), want(out_features);
    testing::RoundToHalf(cpu_y, dtype);  // as the norm reads y
    kernels::GatedRmsNorm({.input = cpu_y.data(),
                           .gate = in.data(),
                           .gate_stride = in_proj,
                           .weight = norm_w.data(),
                           .output = cpu_normed.data(),
                           .num_tokens = 1,
                           .width = inner,
                           .group_size = inner,
                           .epsilon = 1e-5});
    kernels::LinearParams linear;
    linear.input = cpu_normed.data();
    linear.weight = out_w.data();
    linear.output = want.data();
    linear.num_tokens = 1;
    linear.in_features = inner;
    linear.out_features = out_features;
    kernels::Linear(linear);
    // The GPU's decode kernel with the norm's gating, then the skinny GEMM with its scale.
    DeviceBuffer<float> partials(static_cast<size_t>(kMaxSkinnyNormPartials));
    partials.Poison();
    const SsmDecodeParams decode{.conv = conv,
                                 .scan = scan,
                                 .blocks = blocks,
                                 .norm = {.gate = d_in.get(),
                                          .gate_stride = in_proj,
                                          .weight = d_norm_w.get(),
                                          .partials = partials.get()}};
    const int64_t num_partials = SsmDecodeNormPartials(decode);
    ASSERT_GT(num_partials, 0);
    ASSERT_LE(num_partials, kMaxSkinnyNormPartials);
    CUDA_ASSERT(Launch(decode, nullptr));
    for (auto [out_dtype, k_split] : {std::pair{DType::kBF16, 1}, std::pair{DType::kF32, 1},
                                      std::pair{DType::kBF16, 2}}) {
      SCOPED_TRACE(::testing::Message() << "k split " << k_split);
      DeviceBuffer<uint8_t> d_out = Poisoned(out_features, out_dtype);
      SkinnyGemmParams gemm{.x = d_y.get(),
                            .w = d_out_w.get(),
                            .y = d_out.get(),
                            .m = 1,
                            .n = out_features,
                            .k = inner,
                            .input_dtype = dtype,
                            .output_dtype = out_dtype,
                            .k_split = k_split,
                            .norm_partials = partials.get(),
                            .num_norm_partials = num_partials,
                            .norm_width = inner,
                            .norm_epsilon = 1e-5f};
      ASSERT_TRUE(gemm.Validate().ok()) << gemm.Validate();
      CUDA_ASSERT(Launch(gemm, nullptr));
      CUDA_ASSERT(cudaDeviceSynchronize());
      EXPECT_LE(RelativeL2(Download(d_out, out_dtype), want), 2e-2)
          << "out_proj, " << testing::Name(out_dtype);
    }
    EXPECT_LE(RelativeL2(gpu_ssm.Download(), cpu_ssm), 2e-2) << "SSM states";
  }
}

TEST(SsmGpuTest, DecodeWithGatedNormAndOutProjMatchTheCpu) {
  LMSERVE_REQUIRE_GPU();
  // Mamba-2-2.7B's heads in both block shapes (16 rows a block, 4 blocks a head; a head a
  // block); state 256 in large blocks (4 rows a group, a head of 32 a block) and 2 groups; state
  // 32 in small blocks of 32 rows over heads of 40 (24 rows of each head's last block past it).
  CheckDecodeWithGatedNorm({4, 64, 128, 1}, SsmDecodeBlocks::kSmall);
  CheckDecodeWithGatedNorm({4, 64, 128, 1}, SsmDecodeBlocks::kLarge);
  CheckDecodeWithGatedNorm({4, 32, 256, 2}, SsmDecodeBlocks::kLarge);
  CheckDecodeWithGatedNorm({6, 40, 32, 2}, SsmDecodeBlocks::kSmall);
  // k 2048: out_proj's k split over two warps (half of k a full step of the GEMM's loop).
  CheckDecodeWithGatedNorm({32, 64, 128, 1}, SsmDecodeBlocks::kSmall);
}

// The skinny GEMM's norm epilogue takes one row and at most kMaxSkinnyNormPartials partials.
TEST(SsmGpuTest, NormEpilogueShapesAreChecked) {
  alignas(16) static uint16_t buffer[64];  // Validate reads no memory: host addresses do
  static float partials[8];
  SkinnyGemmParams gemm{.x = buffer,
                        .w = buffer,
                        .y = buffer,
                        .m = 1,
                        .n = 2,
                        .k = 16,
                        .norm_partials = partials,
                        .num_norm_partials = 8,
                        .norm_width = 16,
                        .norm_epsilon = 1e-5f};
  EXPECT_TRUE(gemm.Validate().ok()) << gemm.Validate();
  gemm.m = 2;
  EXPECT_FALSE(gemm.Validate().ok());
  gemm.m = 1;
  gemm.num_norm_partials = kMaxSkinnyNormPartials + 1;
  EXPECT_FALSE(gemm.Validate().ok());
  gemm.num_norm_partials = 8;
  gemm.silu_and_mul = true;
  EXPECT_FALSE(gemm.Validate().ok());
}

TEST(SsmGpuTest, UnsupportedShapesAreRefused) {
  SsmScanParams scan;
  scan.num_heads = 4;
  scan.head_dim = 12;  // not a multiple of 8
  scan.state_size = 16;
  scan.xbc_stride = 1000;
  scan.dt_stride = 4;
  EXPECT_FALSE(scan.Validate().ok());
  scan.head_dim = 16;
  scan.state_size = 24;  // not a supported state size
  EXPECT_FALSE(scan.Validate().ok());
  scan.state_size = 16;
  EXPECT_TRUE(scan.Validate().ok()) << scan.Validate();
}


// The vectorized conv (8 channels a thread, the window in registers) and the scalar one against
// the CPU twin over three steps that continue each other's rings: prefills of 1, 40 and 97
// tokens, then 1, 5 and 33 tokens, then 2, 1 and 64; conv kernels of 4 taps (Mamba-2's) and 2
// (the window's first taps unused). Channels 136: a partial block of threads.
TEST(SsmGpuTest, VectorizedConvMatchesTheCpuOverThreeSteps) {
  LMSERVE_REQUIRE_GPU();
  constexpr int64_t kChannels = 136, kStride = 160, kSlotCount = 4;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int64_t taps : {4, 2}) {
      for (bool scalar : {false, true}) {
        const uint32_t seed = FreshSeed();
        SCOPED_TRACE(::testing::Message() << testing::Name(dtype) << " kernel " << taps
                                          << (scalar ? " scalar" : " vectorized") << " seed "
                                          << seed);
        std::mt19937 rng(seed);
        std::vector<float> w = RandomFloats(kChannels * taps, rng, 0.5f);
        std::vector<float> b = RandomFloats(kChannels, rng, 0.1f);
        DeviceBuffer<uint8_t> d_w = Upload(w, dtype), d_b = Upload(b, dtype);
        const std::vector<int32_t> slots = {2, 0, 3};
        DeviceBuffer<int32_t> d_slots(slots);
        std::vector<float> cpu_ring(kSlotCount * (taps - 1) * kChannels, 7.0f);
        DeviceBuffer<float> gpu_ring(static_cast<size_t>(kSlotCount * taps * kChannels));
        gpu_ring.Poison(0x40);
        const Step steps[] = {{{1, 40, 97}, {1, 40, 97}},
                              {{1, 5, 33}, {2, 45, 130}},
                              {{2, 1, 64}, {4, 46, 194}}};
        for (size_t k = 0; k < 3; ++k) {
          SCOPED_TRACE(::testing::Message() << "step " << k);
          std::vector<int32_t> query_start = {0};
          for (int32_t len : steps[k].lens) query_start.push_back(query_start.back() + len);
          const int64_t tokens = query_start.back();
          std::vector<float> in = RandomFloats(tokens * kStride, rng);
          DeviceBuffer<uint8_t> d_in = Upload(in, dtype);
          DeviceBuffer<int32_t> d_qs(query_start), d_ctx(steps[k].context_lens);
          std::vector<float> want(tokens * kChannels);
          kernels::CausalConv1d({.seqs = {.query_start = query_start.data(),
                                          .context_lens = steps[k].context_lens.data(),
                                          .state_slots = slots.data(),
                                          .num_seqs = 3,
                                          .num_slots = kSlotCount},
                                 .input = in.data(),
                                 .input_stride = kStride,
                                 .weight = w.data(),
                                 .bias = b.data(),
                                 .output = want.data(),
                                 .conv_states = cpu_ring.data(),
                                 .channels = kChannels,
                                 .kernel = taps});
          DeviceBuffer<uint8_t> d_out = Poisoned(tokens * kChannels, dtype);
          const SsmConvParams conv{.seqs = {.query_start = d_qs.get(),
                                            .context_lens = d_ctx.get(),
                                            .state_slots = d_slots.get(),
                                            .num_seqs = 3,
                                            .num_slots = kSlotCount},
                                   .input = d_in.get(),
                                   .input_stride = kStride,
                                   .weight = d_w.get(),
                                   .bias = d_b.get(),
                                   .output = d_out.get(),
                                   .conv_states = gpu_ring.get(),
                                   .channels = kChannels,
                                   .kernel = taps,
                                   .dtype = dtype,
                                   .num_tokens = tokens,
                                   .scalar = scalar};
          EXPECT_EQ(SsmConvUsesVectors(conv), !scalar);
          CUDA_ASSERT(Launch(conv, nullptr));
          CUDA_ASSERT(cudaDeviceSynchronize());
          EXPECT_LE(RelativeL2(Download(d_out, dtype), want), testing::Tolerance(dtype));
        }
      }
    }
  }
}

// The chunked SSD scan (tensor cores) against the CPU twin's scan and the GPU's recurrence:
// the four head shapes it is built for (state 16: warps that hold none of the state), blocks of
// 4 warps (the default) in bf16 and fp16 and of 8 in bf16; two steps of four sequences in odd
// slots — lengths 1, 64, 200 (four chunks, the last short) and 130 from zero state, then 1, 1,
// 65 and 127 continuing from the states the first step left (carried state, 1-token sequences in a
// prefill step). Then one prompt of 150 tokens fed in pieces of 1, 7, 32, 50 and 60 (state
// carried through the slot) against the same prompt at once. Bounds (relative L2): 1e-2 on the
// outputs (16-bit operands of the products: C B^T, the mask, the state copy, x o w), 2e-2 on the
// fp32 states.
struct SsdShapeCase {
  int64_t heads, head_dim, state, groups;
};

TEST(SsmGpuTest, SsdScanMatchesTheCpuAndTheRecurrence) {
  LMSERVE_REQUIRE_GPU();
  constexpr int64_t kSlotCount = 6;
  for (const SsdShapeCase& shape :
       {SsdShapeCase{4, 64, 128, 1}, SsdShapeCase{4, 64, 64, 2}, SsdShapeCase{2, 32, 128, 1},
        SsdShapeCase{8, 32, 16, 1}}) {
    for (const std::pair<DType, int>& variant :
         {std::pair{DType::kBF16, 4}, std::pair{DType::kF16, 4}, std::pair{DType::kBF16, 8}}) {
      const DType dtype = variant.first;
      const int warps = variant.second;
      const int64_t heads = shape.heads, hd = shape.head_dim, n = shape.state;
      const int64_t inner = heads * hd, xbc_width = inner + 2 * shape.groups * n;
      const int64_t dt_stride = heads + 8;
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message() << testing::Name(dtype) << " heads " << heads << " x "
                                        << hd << ", state " << n << ", groups " << shape.groups
                                        << ", " << warps << " warps a block, seed " << seed);
      std::mt19937 rng(seed);
      std::vector<float> dt_bias = RandomFloats(heads, rng, 0.5f, -1.0f);
      std::vector<float> a_log = RandomFloats(heads, rng, 0.5f);
      std::vector<float> d = RandomFloats(heads, rng, 1.0f);
      DeviceBuffer<uint8_t> d_dt_bias = Upload(dt_bias, dtype), d_a_log = Upload(a_log, dtype),
                            d_d = Upload(d, dtype);
      const size_t state_floats = static_cast<size_t>(kSlotCount * heads * hd * n);
      std::vector<float> cpu_ssm(state_floats, 7.0f);
      DeviceBuffer<float> ssd_ssm(cpu_ssm), rec_ssm(cpu_ssm);
      // One step of `lens` tokens a sequence in `slots`, on the CPU, the SSD kernel and the
      // recurrence; returns the SSD kernel's outputs.
      auto run_step = [&](const std::vector<int32_t>& lens, const std::vector<int32_t>& context,
                          const std::vector<int32_t>& slots, std::vector<float>& xbc,
                          std::vector<float>& dt, bool compare) {
        const int64_t seqs = static_cast<int64_t>(lens.size());
        std::vector<int32_t> query_start = {0};
        for (int32_t len : lens) query_start.push_back(query_start.back() + len);
        const int64_t tokens = query_start.back();
        DeviceBuffer<uint8_t> d_xbc = Upload(xbc, dtype), d_dt = Upload(dt, dtype);
        DeviceBuffer<int32_t> d_qs(query_start), d_ctx(context), d_slots(slots);
        std::vector<float> want(tokens * inner);
        kernels::SsmScan({.seqs = {.query_start = query_start.data(),
                                   .context_lens = context.data(),
                                   .state_slots = slots.data(),
                                   .num_seqs = seqs,
                                   .num_slots = kSlotCount},
                          .xbc = xbc.data(),
                          .xbc_stride = xbc_width,
                          .dt = dt.data(),
                          .dt_stride = dt_stride,
                          .dt_bias = dt_bias.data(),
                          .a_log = a_log.data(),
                          .d = d.data(),
                          .output = want.data(),
                          .ssm_states = cpu_ssm.data(),
                          .num_heads = heads,
                          .head_dim = hd,
                          .state_size = n,
                          .n_groups = shape.groups,
                          .chunk_size = 16});
        DeviceBuffer<uint8_t> ssd_y = Poisoned(tokens * inner, dtype);
        DeviceBuffer<uint8_t> rec_y = Poisoned(tokens * inner, dtype);
        SsmScanParams scan{.seqs = {.query_start = d_qs.get(),
                                    .context_lens = d_ctx.get(),
                                    .state_slots = d_slots.get(),
                                    .num_seqs = seqs,
                                    .num_slots = kSlotCount},
                           .xbc = d_xbc.get(),
                           .xbc_stride = xbc_width,
                           .dt = d_dt.get(),
                           .dt_stride = dt_stride,
                           .dt_bias = d_dt_bias.get(),
                           .a_log = d_a_log.get(),
                           .d = d_d.get(),
                           .output = ssd_y.get(),
                           .ssm_states = ssd_ssm.get(),
                           .num_heads = heads,
                           .head_dim = hd,
                           .state_size = n,
                           .n_groups = shape.groups,
                           .dtype = dtype,
                           .ssd_warps = warps};
        EXPECT_TRUE(SsmScanUsesSsd(scan));
        EXPECT_EQ(Launch(scan, nullptr), cudaSuccess);
        scan.recurrence = true;
        scan.output = rec_y.get();
        scan.ssm_states = rec_ssm.get();
        EXPECT_FALSE(SsmScanUsesSsd(scan));
        EXPECT_EQ(Launch(scan, nullptr), cudaSuccess);
        EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> got = Download(ssd_y, dtype);
        if (compare) {
          EXPECT_LE(RelativeL2(got, want), 1e-2) << "SSD output against the CPU";
          EXPECT_LE(RelativeL2(got, Download(rec_y, dtype)), 1e-2)
              << "SSD output against the recurrence";
          EXPECT_LE(RelativeL2(ssd_ssm.Download(), cpu_ssm), 2e-2) << "SSD states against the CPU";
        }
        return got;
      };
      auto inputs = [&](int64_t tokens, std::vector<float>& xbc, std::vector<float>& dt) {
        xbc = RandomFloats(tokens * xbc_width, rng);
        dt = RandomFloats(tokens * dt_stride, rng);
      };
      std::vector<float> xbc, dt;
      {
        SCOPED_TRACE("step 1 (from zero)");
        inputs(1 + 64 + 200 + 130, xbc, dt);
        run_step({1, 64, 200, 130}, {1, 64, 200, 130}, {5, 0, 3, 1}, xbc, dt, true);
      }
      {
        SCOPED_TRACE("step 2 (continuing)");
        inputs(1 + 1 + 65 + 127, xbc, dt);
        run_step({1, 1, 65, 127}, {2, 65, 265, 257}, {5, 0, 3, 1}, xbc, dt, true);
      }
      // One prompt at once (slot 2) and in pieces (slot 4).
      const int64_t prompt = 150;
      std::vector<float> p_xbc, p_dt;
      inputs(prompt, p_xbc, p_dt);
      std::vector<float> whole;
      {
        SCOPED_TRACE("the prompt at once");
        whole = run_step({static_cast<int32_t>(prompt)}, {static_cast<int32_t>(prompt)}, {2},
                         p_xbc, p_dt, true);
      }
      std::vector<float> pieces;
      int32_t done = 0;
      for (int32_t piece : {1, 7, 32, 50, 60}) {
        SCOPED_TRACE(::testing::Message() << "a piece of " << piece << " after " << done);
        std::vector<float> x(p_xbc.begin() + done * xbc_width,
                             p_xbc.begin() + (done + piece) * xbc_width);
        std::vector<float> t(p_dt.begin() + done * dt_stride,
                             p_dt.begin() + (done + piece) * dt_stride);
        done += piece;
        const std::vector<float> got = run_step({piece}, {done}, {4}, x, t, true);
        pieces.insert(pieces.end(), got.begin(), got.end());
      }
      EXPECT_LE(RelativeL2(pieces, whole), 1e-2) << "pieces against the prompt at once";
      const std::vector<float> states = ssd_ssm.Download();
      const size_t slot_floats = static_cast<size_t>(heads * hd * n);
      const std::vector<float> at_once(states.begin() + 2 * slot_floats,
                                       states.begin() + 3 * slot_floats);
      const std::vector<float> in_pieces(states.begin() + 4 * slot_floats,
                                         states.begin() + 5 * slot_floats);
      EXPECT_LE(RelativeL2(in_pieces, at_once), 2e-2) << "states: pieces against at once";
    }
  }
}

// Shapes, types and layouts the SSD kernel is not built for run the recurrence.
TEST(SsmGpuTest, SsdScanFallsBackToTheRecurrence) {
  SsmScanParams scan{.seqs = {},
                     .xbc_stride = 64 * 4 + 256,
                     .num_heads = 4,
                     .head_dim = 64,
                     .state_size = 128,
                     .n_groups = 1,
                     .dtype = DType::kBF16};
  alignas(16) static char buffer[64];
  scan.xbc = buffer;
  scan.output = buffer;
  scan.ssm_states = reinterpret_cast<float*>(buffer);
  EXPECT_TRUE(SsmScanUsesSsd(scan));
  SsmScanParams other = scan;
  other.dtype = DType::kF32;
  EXPECT_FALSE(SsmScanUsesSsd(other)) << "fp32";
  other = scan;
  other.state_size = 256;
  EXPECT_FALSE(SsmScanUsesSsd(other)) << "state 256";
  other = scan;
  other.head_dim = 16;
  EXPECT_FALSE(SsmScanUsesSsd(other)) << "head_dim 16";
  other = scan;
  other.xbc_stride += 4;
  EXPECT_FALSE(SsmScanUsesSsd(other)) << "a stride not a multiple of 8";
  other = scan;
  other.xbc = buffer + 2;
  EXPECT_FALSE(SsmScanUsesSsd(other)) << "unaligned rows";
  other = scan;
  other.recurrence = true;
  EXPECT_FALSE(SsmScanUsesSsd(other)) << "asked for the recurrence";
}

}  // namespace
}  // namespace lmserve::kernels::cuda
