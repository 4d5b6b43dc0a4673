#include "tests/testing/fixtures.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/strings.h"
#include "engine/model/safetensors.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace lmserve::testing {

const std::vector<std::string>& HfTinyModelNames() {
  static const std::vector<std::string> kNames = {"llama-gqa", "llama-mqa-tied-llama3rope",
                                                  "llama-hd128", "qwen2-bias"};
  return kNames;
}

std::string FixturesDir() {
  if (const char* env = std::getenv("LMSERVE_FIXTURES_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  return LMSERVE_FIXTURES_DIR;
}

std::string HfTinyDir(const std::string& model_name) {
  return StrCat(FixturesDir(), "/hf-tiny/", model_name);
}

std::string HfFamilyDir(const std::string& model_name) {
  return StrCat(FixturesDir(), "/hf-families/", model_name);
}

HfTinyReference LoadHfTinyReference(const std::string& model_name) {
  return LoadReference(HfTinyDir(model_name));
}

std::vector<float> LoadHfTinyReferenceLogits(const std::string& model_name, int prompt_index) {
  return LoadReferenceLogits(HfTinyDir(model_name), prompt_index);
}

HfTinyReference LoadReference(const std::string& dir) {
  const std::string path = dir + "/reference.json";
  std::ifstream in(path);
  if (!in) ADD_FAILURE() << "cannot open " << path;
  const nlohmann::json j = nlohmann::json::parse(in);
  HfTinyReference ref;
  ref.prompts = j.at("prompts").get<std::vector<std::vector<int32_t>>>();
  ref.greedy = j.at("greedy").get<std::vector<std::vector<int32_t>>>();
  ref.greedy_margin = j.at("greedy_margin").get<std::vector<std::vector<double>>>();
  return ref;
}

std::vector<float> LoadReferenceLogits(const std::string& dir, int prompt_index) {
  const std::string path = dir + "/reference_logits.safetensors";
  auto file = engine::SafetensorsFile::Open(path);
  if (!file.ok()) {
    ADD_FAILURE() << file.status();
    return {};
  }
  auto logits = (*file)->ReadF32(StrCat("logits_", prompt_index));
  if (!logits.ok()) {
    ADD_FAILURE() << logits.status();
    return {};
  }
  return *std::move(logits);
}

std::optional<std::string> DemoModelPath() {
  std::string path;
  if (const char* env = std::getenv("LMSERVE_DEMO_MODEL"); env != nullptr && *env != '\0') {
    path = env;
  } else {
    const char* cache = std::getenv("LMSERVE_CACHE_DIR");
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    std::string dir = cache != nullptr ? cache
                      : xdg != nullptr ? StrCat(xdg, "/lmserve")
                                       : StrCat(home != nullptr ? home : "", "/.cache/lmserve");
    path = dir + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  return path;
}

std::string TempDir() {
  // Never freed: the exit handler that removes the directory runs after static destructors.
  static const std::string* const dir = [] {
    std::string pattern = (std::filesystem::temp_directory_path() / "lmserve-test-XXXXXX").string();
    const char* made = ::mkdtemp(pattern.data());
    if (made == nullptr) {
      ADD_FAILURE() << "mkdtemp failed";
      std::abort();
    }
    auto* path = new std::string(made);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(TempDir(), ec);
    });
    return path;
  }();
  return *dir;
}

double ScaledError(std::span<const float> got, std::span<const float> want) {
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double scale = std::max(1.0, std::abs(double{want[i]}) / 10);
    worst = std::max(worst, std::abs(double{got[i]} - want[i]) / scale);
  }
  return worst;
}

}  // namespace lmserve::testing
