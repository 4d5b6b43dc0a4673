// The one 64-bit mixing function: splitmix64's finalizer (Steele, Lea and Flood, "Fast splittable
// pseudorandom number generators"). Block hashes, per-request seeds and dummy weights all derive
// from it, on the host and (random fills) on the device.

#ifndef LMSERVE_COMMON_HASH_H_
#define LMSERVE_COMMON_HASH_H_

#include <cstdint>

#ifdef __CUDACC__
#define LMSERVE_COMMON_HOST_DEVICE __host__ __device__
#else
#define LMSERVE_COMMON_HOST_DEVICE
#endif

namespace lmserve {

// 2^64 / golden ratio: splitmix64's increment.
inline constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ULL;

// splitmix64's output function: a bijection of 64-bit values with full avalanche.
LMSERVE_COMMON_HOST_DEVICE constexpr uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// The next value of the splitmix64 generator whose state is *state.
LMSERVE_COMMON_HOST_DEVICE constexpr uint64_t SplitMix64(uint64_t* state) {
  *state += kGoldenGamma;
  return Mix64(*state);
}

// Element i of the splitmix64 stream seeded `seed` (SplitMix64 called i + 1 times), in O(1).
LMSERVE_COMMON_HOST_DEVICE constexpr uint64_t SplitMix64At(uint64_t seed, uint64_t i) {
  return Mix64(seed + kGoldenGamma * (i + 1));
}

// Combines a running hash with one more value (order-dependent).
LMSERVE_COMMON_HOST_DEVICE constexpr uint64_t HashCombine(uint64_t hash, uint64_t value) {
  return Mix64(hash ^ (value + kGoldenGamma));
}

}  // namespace lmserve

#endif  // LMSERVE_COMMON_HASH_H_
