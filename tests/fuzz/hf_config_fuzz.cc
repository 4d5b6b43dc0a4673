// libFuzzer target: config.json parsing. Arbitrary bytes are parsed as JSON and, when they are JSON,
// read as a Hugging Face model config. Nothing may crash, throw or hang; the result is a config that
// passed validation or an error status.

#include <cstddef>
#include <cstdint>

#include "engine/model/model_config.h"
#include "nlohmann/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json config = nlohmann::json::parse(data, data + size, nullptr,
                                                      /*allow_exceptions=*/false);
  if (config.is_discarded()) return 0;
  const auto parsed = lmserve::engine::ParseHfConfig(config, &config);
  if (parsed.ok()) {
    // A config that validates must be usable: rotary frequencies are finite and non-negative.
    for (double f : lmserve::engine::RopeInverseFrequencies(parsed->rope, parsed->head_dim)) {
      if (!(f >= 0) || !(f < 1e300)) __builtin_trap();
    }
  }
  return 0;
}
