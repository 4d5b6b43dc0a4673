// Model families: each architecture described once, for every runner.
//
// A family (as llama.cpp's src/models/<arch>.cpp) has three parts:
//   1. what it is called: Hugging Face `architectures` / `model_type`, GGUF `general.architecture`,
//      and the config keys of its own (ModelFamily::read_hf_config / read_gguf_config);
//   2. its tensors: a WeightPlan of checkpoint names, shapes and fusions (weight_plan.h);
//   3. its forward pass: the layer order, written against ForwardOps (ops.h).
// Parts 2 and 3 are a ModelDescription, built from a validated ModelConfig by the family's
// `describe`. Runners take a ModelDescription and implement the ops; none spells a layer order.
// A new family that needs no new op touches no runner: it is a ModelFamily registered with
// RegisterModelFamily (the built-in ones are in engine/model/families/).

#ifndef LMSERVE_ENGINE_MODEL_FAMILY_H_
#define LMSERVE_ENGINE_MODEL_FAMILY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/ops.h"
#include "engine/model/weight_plan.h"
#include "nlohmann/json_fwd.hpp"

namespace lmserve::engine {

class GgufFile;

// One model: its configuration, tensors, rotary embeddings and forward pass. Immutable; a runner
// keeps it for its lifetime.
class ModelDescription {
 public:
  virtual ~ModelDescription() = default;

  const ModelConfig& config() const { return config_; }
  const WeightPlan& weights() const { return weights_; }
  // The rotary embeddings the layers use (AttentionLayer::rope indexes this): one table each.
  const std::vector<RopeConfig>& rotary() const { return rotary_; }
  // Per KV cache layer (AttentionLayer::layer), the window of the layers that use it: 0 for full
  // attention, W for a sliding window over the last W positions (equal to their
  // AttentionLayer::window; runners refuse a layer that reads beyond it). The engine groups layers
  // by it (kv_cache_groups.h) and frees the blocks that have left a windowed group's window. A
  // description that leaves it 0 keeps every block, whatever its layers' windows.
  const std::vector<int32_t>& kv_windows() const { return kv_windows_; }

  // One step's forward pass: embeddings, layers, the final norm, the LM head and the sampler.
  virtual absl::Status Forward(ForwardOps& ops) const = 0;

 protected:
  // kv_windows_ starts as num_layers zeros (full attention everywhere).
  explicit ModelDescription(const ModelConfig& config)
      : config_(config), kv_windows_(static_cast<size_t>(config.num_layers), 0) {}

  ModelConfig config_;
  WeightPlan weights_;
  std::vector<RopeConfig> rotary_;
  std::vector<int32_t> kv_windows_;  // [num_layers]
};

// The Hugging Face names of a mixture-of-experts layer's tensors, after "model.layers.L.": the
// router's, and expert E's gate, up and down projections at experts + "E." + gate (up, down).
// Families declare them (their WeightPlan) and the GGUF reader maps llama.cpp's ffn_gate_inp and
// ffn_{gate,up,down}_exps tensors to them (one view per expert of the 3-D tensors).
struct MoeTensorNames {
  std::string router;   // "block_sparse_moe.gate.weight"
  std::string experts;  // "block_sparse_moe.experts."
  std::string gate;     // "w1.weight"
  std::string up;       // "w3.weight"
  std::string down;     // "w2.weight"

  // "model.layers.L.<experts>E.<projection>".
  std::string Expert(int64_t layer, int64_t expert, std::string_view projection) const;
};

struct ModelFamily {
  std::string name;                           // ModelConfig::family: "llama"
  std::vector<std::string> hf_architectures;  // config.json "architectures[0]" values it serves
  std::vector<std::string> hf_model_types;    // config.json "model_type" (when no architectures)
  // GGUF: the `general.architecture` it reads and exports ("" for none), and the Q/K row layout
  // llama.cpp's converter writes for it (it permutes llama's rows for interleaved rotary).
  std::string gguf_architecture;
  RopeLayout gguf_rope_layout = RopeLayout::kHalfSplit;
  // Layer tensor names of its own, (GGUF name after "blk.N.", Hugging Face name after
  // "model.layers.N."), consulted before the names every family shares (gguf_checkpoint.cc); a
  // Hugging Face name listed here is written under this GGUF name.
  std::vector<std::pair<std::string, std::string>> gguf_layer_names;
  // Whether it reads the GGUF architecture's files that have experts ({arch}.expert_count > 0):
  // llama files with experts are Mixtral's, without them Llama's.
  bool gguf_experts = false;
  // Mixture-of-experts families: their tensors' names (the description's and the GGUF mapping's).
  std::optional<MoeTensorNames> moe_names;
  // Reads the family's own config keys, after the keys every family shares (ParseHfConfig, the
  // GGUF reader). Null: none.
  std::function<absl::Status(const nlohmann::json& config, ModelConfig* out)> read_hf_config;
  std::function<absl::Status(const GgufFile& file, ModelConfig* out)> read_gguf_config;
  // The model of a valid config of this family.
  std::function<std::unique_ptr<ModelDescription>(const ModelConfig& config)> describe;
};

// Adds a family (tests and new families). REQUIRES: its names are not taken. Thread-compatible:
// call before models are opened, as static initializers do.
void RegisterModelFamily(ModelFamily family);

// The family serving a Hugging Face config's first `architectures` entry, or, when it names none,
// its `model_type`; nullptr when none does.
const ModelFamily* FindHfFamily(std::string_view architecture, std::string_view model_type);
// The family reading GGUF files of `general.architecture`, with experts or without
// (ModelFamily::gguf_experts; a family of the other kind when none matches); nullptr when none
// reads the architecture.
const ModelFamily* FindGgufFamily(std::string_view gguf_architecture, bool has_experts = false);
// The family of ModelConfig::family; nullptr for an unknown name.
const ModelFamily* FindFamily(std::string_view name);
// "LlamaForCausalLM, MistralForCausalLM, ..." / "llama, qwen2": for error messages.
std::string SupportedHfArchitectures();
std::string SupportedGgufArchitectures();

// The model of `config`: its family's description. Errors: an unknown family, an invalid config.
absl::StatusOr<std::unique_ptr<ModelDescription>> DescribeModel(const ModelConfig& config);

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_MODEL_FAMILY_H_
