#include "engine/runner/dummy_weights.h"

#include <cmath>

namespace lmserve::engine {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

DummyRange DummyWeightRange(std::string_view name, int64_t fan_in) {
  if (EndsWith(name, "norm.weight")) return {1.0f, 1.0f};
  if (EndsWith(name, ".bias")) return {-0.02f, 0.02f};
  if (name == "model.embed_tokens.weight") return {-0.05f, 0.05f};
  const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in > 0 ? fan_in : 1));
  return {-bound, bound};
}

uint64_t DummyTensorSeed(std::string_view name) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (char c : name) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;
  }
  return hash;
}

void FillDummyF32(std::string_view name, int64_t fan_in, float* dst, int64_t n) {
  const DummyRange range = DummyWeightRange(name, fan_in);
  const uint64_t seed = DummyTensorSeed(name);
  const float span = range.high - range.low;
  for (int64_t i = 0; i < n; ++i) dst[i] = range.low + span * DummyUnit(seed, i);
}

}  // namespace lmserve::engine
