#include "engine/model/family.h"

#include <algorithm>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/core/check.h"
#include "engine/model/checkpoint.h"
#include "engine/model/families/llama.h"
#include "engine/model/families/mamba2.h"

namespace lmserve::engine {
namespace {

// The registry: the built-in families first (so that their GGUF names win), then registered ones.
// Families are only added, never removed: the pointers handed out stay valid.
struct Registry {
  absl::Mutex mu;
  std::vector<std::unique_ptr<ModelFamily>> families ABSL_GUARDED_BY(mu);
};

Registry& GetRegistry() {
  static Registry* const registry = [] {
    auto* r = new Registry;
    absl::MutexLock lock(&r->mu);
    for (ModelFamily family :
         {LlamaFamily(), MistralFamily(), Qwen2Family(), Qwen3Family(), Phi3Family(),
          Gemma2Family(), Gemma3Family(), MixtralFamily(), Qwen3MoeFamily(), Mamba2Family()}) {
      r->families.push_back(std::make_unique<ModelFamily>(std::move(family)));
    }
    return r;
  }();
  return *registry;
}

bool Contains(const std::vector<std::string>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

template <typename Predicate>
const ModelFamily* FindIf(Predicate predicate) {
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  for (const auto& family : registry.families) {
    if (predicate(*family)) return family.get();
  }
  return nullptr;
}

}  // namespace

void RegisterModelFamily(ModelFamily family) {
  for (const std::string& arch : family.hf_architectures) {
    LMSERVE_CORE_CHECK(FindHfFamily(arch, "") == nullptr, "architecture ", arch,
                       " is registered twice");
  }
  LMSERVE_CORE_CHECK(FindFamily(family.name) == nullptr, "family ", family.name,
                     " is registered twice");
  LMSERVE_CORE_CHECK(family.describe != nullptr, "family ", family.name, " has no describe");
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  registry.families.push_back(std::make_unique<ModelFamily>(std::move(family)));
}

const ModelFamily* FindHfFamily(std::string_view architecture, std::string_view model_type) {
  if (!architecture.empty()) {
    return FindIf([&](const ModelFamily& f) { return Contains(f.hf_architectures, architecture); });
  }
  return FindIf([&](const ModelFamily& f) { return Contains(f.hf_model_types, model_type); });
}

const ModelFamily* FindGgufFamily(std::string_view gguf_architecture, bool has_experts) {
  if (gguf_architecture.empty()) return nullptr;
  const ModelFamily* family = FindIf([&](const ModelFamily& f) {
    return f.gguf_architecture == gguf_architecture && f.gguf_experts == has_experts;
  });
  if (family != nullptr) return family;
  return FindIf([&](const ModelFamily& f) { return f.gguf_architecture == gguf_architecture; });
}

std::string MoeTensorNames::Expert(int64_t layer, int64_t expert,
                                   std::string_view projection) const {
  return LayerTensorName(layer, StrCat(experts, expert, ".", projection));
}

const ModelFamily* FindFamily(std::string_view name) {
  return FindIf([&](const ModelFamily& f) { return f.name == name; });
}

std::string SupportedHfArchitectures() {
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  std::vector<std::string> names;
  for (const auto& family : registry.families) {
    names.insert(names.end(), family->hf_architectures.begin(), family->hf_architectures.end());
  }
  return StrJoin(names, ", ");
}

std::string SupportedGgufArchitectures() {
  Registry& registry = GetRegistry();
  absl::MutexLock lock(&registry.mu);
  std::vector<std::string> names;
  for (const auto& family : registry.families) {
    if (!family->gguf_architecture.empty() && !Contains(names, family->gguf_architecture)) {
      names.push_back(family->gguf_architecture);
    }
  }
  return StrJoin(names, ", ");
}

absl::StatusOr<std::unique_ptr<ModelDescription>> DescribeModel(const ModelConfig& config) {
  LMSERVE_RETURN_IF_ERROR(ValidateModelConfig(config));
  const ModelFamily* family = FindFamily(config.family);
  if (family == nullptr) {
    return absl::UnimplementedError(
        StrCat("model family '", config.family,
               "' is not supported (supported: ", SupportedHfArchitectures(), ")"));
  }
  return family->describe(config);
}

}  // namespace lmserve::engine
