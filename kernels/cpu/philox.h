// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"), the counter-based
// generator cuRAND and PyTorch use, written once for the host and the device so that every sampler
// draws the same numbers.
//
// What a seed means, everywhere (the engine's sampler, the CPU runner's and the CUDA runner's): the
// token at position P (its index in prompt + output) of sample S (0 .. n-1) of a request seeded
// `seed` is decided by the one draw
//   UniformFromSeed(SampleStreamKey(seed, S), P)
// so the stream key is the Philox key and the position the Philox counter. The draw depends on
// nothing else: not on the batch, the step, preemption or which sampler makes it.

#ifndef LMSERVE_KERNELS_CPU_PHILOX_H_
#define LMSERVE_KERNELS_CPU_PHILOX_H_

#include <cstdint>

#include "common/hash.h"

#ifdef __CUDACC__
#define LMSERVE_HOST_DEVICE __host__ __device__
#else
#define LMSERVE_HOST_DEVICE
#endif

namespace lmserve::kernels {

struct Philox4x32 {
  uint32_t v[4];
};

LMSERVE_HOST_DEVICE inline Philox4x32 Philox4x32_10(uint64_t key, uint64_t counter_lo,
                                                     uint64_t counter_hi) {
  uint32_t c0 = static_cast<uint32_t>(counter_lo), c1 = static_cast<uint32_t>(counter_lo >> 32);
  uint32_t c2 = static_cast<uint32_t>(counter_hi), c3 = static_cast<uint32_t>(counter_hi >> 32);
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c0;
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4x32{{c0, c1, c2, c3}};
}

// A uniform number in [0, 1) with 24 random bits, for draw `step` of the stream `seed` (a stream
// key: for a request's tokens, SampleStreamKey's, with the token's position as `step`).
LMSERVE_HOST_DEVICE inline float UniformFromSeed(uint64_t seed, uint64_t step) {
  const Philox4x32 r = Philox4x32_10(seed, step, 0);
  return static_cast<float>(r.v[0] >> 8) * (1.0f / 16777216.0f);
}

// The Philox key of sample `sample_index` of a request seeded `seed`: one splitmix64 step from the
// seed offset by the sample index, so that a request's samples draw from unrelated streams.
LMSERVE_HOST_DEVICE constexpr uint64_t SampleStreamKey(uint64_t seed, uint64_t sample_index) {
  uint64_t state = seed ^ (kGoldenGamma * (sample_index + 1));
  return SplitMix64(&state);
}

}  // namespace lmserve::kernels

#endif  // LMSERVE_KERNELS_CPU_PHILOX_H_
