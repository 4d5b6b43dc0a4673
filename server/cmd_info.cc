// lmserve info --model PATH: the model's configuration and tensors, as JSON.

#include <cstdio>
#include <memory>
#include <string>

#include "engine/model/checkpoint.h"
#include "nlohmann/json.hpp"
#include "server/cli.h"

namespace lmserve::server {
namespace {

struct InfoOptions {
  std::string model_path;
  bool tensors = false;
};

int Run(const InfoOptions& options) {
  absl::StatusOr<std::unique_ptr<engine::Checkpoint>> checkpoint =
      engine::OpenCheckpoint(options.model_path);
  if (!checkpoint.ok()) {
    std::fprintf(stderr, "lmserve info: %s\n", std::string(checkpoint.status().message()).c_str());
    return 1;
  }
  const engine::ModelConfig& c = (*checkpoint)->config();
  nlohmann::json out = {
      {"name", c.name},
      {"architecture", c.architecture_name},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_layers", c.num_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_kv_heads", c.num_kv_heads},
      {"head_dim", c.head_dim},
      {"context_length", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope.theta},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"eos_token_ids", c.eos_token_ids},
  };
  if (options.tensors) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const auto& [name, view] : (*checkpoint)->tensors()) {
      tensors.push_back({{"name", name},
                         {"dtype", std::string(kernels::DTypeName(view.dtype))},
                         {"shape", view.shape}});
    }
    out["tensors"] = std::move(tensors);
  }
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace

CommandRunner DeclareInfo(CLI::App* command) {
  command->footer("Prints a model's configuration and its tensors as JSON.");
  auto options = std::make_shared<InfoOptions>();
  AddStringFlag(command, "--model", &options->model_path,
                "a Hugging Face model directory or a .gguf file")
      ->required();
  AddBoolFlag(command, "--tensors", &options->tensors,
              "also list every tensor with its type and shape");
  return [options] { return Run(*options); };
}

}  // namespace lmserve::server
