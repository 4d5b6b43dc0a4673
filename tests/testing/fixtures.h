// Access to the outside reference fixtures (tests/fixtures: Hugging Face's own numbers) and the demo
// model.

#ifndef LMSERVE_TESTS_TESTING_FIXTURES_H_
#define LMSERVE_TESTS_TESTING_FIXTURES_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace lmserve::testing {

// The four tiny Hugging Face checkpoints in fixtures/hf-tiny.
const std::vector<std::string>& HfTinyModelNames();
// $LMSERVE_FIXTURES_DIR, else the build's LMSERVE_FIXTURES_DIR (default: the repository's
// tests/fixtures).
std::string FixturesDir();
std::string HfTinyDir(const std::string& model_name);

// fixtures/hf-families/NAME: the checkpoints of more architectures, made the same way.
std::string HfFamilyDir(const std::string& model_name);

// DIR/reference.json of a fixture checkpoint directory (hf-tiny/NAME, hf-families/NAME).
struct HfTinyReference {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> greedy;
  std::vector<std::vector<double>> greedy_margin;
};
HfTinyReference LoadReference(const std::string& dir);
HfTinyReference LoadHfTinyReference(const std::string& model_name);

// logits_J of DIR/reference_logits.safetensors, row-major [len(prompt J), vocab].
std::vector<float> LoadReferenceLogits(const std::string& dir, int prompt_index);
std::vector<float> LoadHfTinyReferenceLogits(const std::string& model_name, int prompt_index);

// How far logits `got` are from `want`, the way the fixture tests bound it: the largest
// |got - want| / max(1, |want| / 10) (absolute up to |logit| 10, relative beyond: errors grow with
// a logit's size, and tied-embedding models' logits reach the hundreds).
double ScaledError(std::span<const float> got, std::span<const float> want);

// The demo model (SmolLM2-135M-Instruct Q4_1 GGUF): $LMSERVE_DEMO_MODEL, else the cache path that
// scripts/fetch-demo-model.sh uses. nullopt when the file is absent.
std::optional<std::string> DemoModelPath();

// A fresh temporary directory, removed at process exit.
std::string TempDir();

}  // namespace lmserve::testing

#endif  // LMSERVE_TESTS_TESTING_FIXTURES_H_
