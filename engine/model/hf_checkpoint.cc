// Hugging Face model directories: config.json (+ generation_config.json), and model.safetensors or
// shards listed by model.safetensors.index.json. Every shard stays memory-mapped; tensors point into
// the mappings.

#include <filesystem>
#include <set>

#include "common/file.h"
#include "common/status.h"
#include "common/strings.h"
#include "engine/model/checkpoint.h"
#include "engine/model/safetensors.h"
#include "nlohmann/json.hpp"

namespace lmserve::engine {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// `text` with Python's non-finite literals (Infinity, -Infinity, NaN, which json.dumps writes and
// JSON lacks: Mamba-2 configs' "time_step_limit": [0.0, Infinity]) outside strings made null.
std::string NonFiniteAsNull(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < text.size()) {
        out += text[++i];
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') in_string = true;
    bool replaced = false;
    for (std::string_view word : {"-Infinity", "Infinity", "NaN"}) {
      if (text.substr(i, word.size()) == word) {
        out += "null";
        i += word.size() - 1;
        replaced = true;
        break;
      }
    }
    if (!replaced) out += c;
  }
  return out;
}

absl::StatusOr<json> ReadJsonFile(const fs::path& path) {
  absl::StatusOr<std::string> text = ReadFile(path.string());
  if (!text.ok()) return absl::Status(text.status().code(), StrCat(path.string(), ": cannot open"));
  json parsed = json::parse(NonFiniteAsNull(*text), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return absl::InvalidArgumentError(StrCat(path.string(), ": not valid JSON"));
  }
  return parsed;
}

class HfCheckpoint : public Checkpoint {
 public:
  CheckpointFormat format() const override { return CheckpointFormat::kSafetensors; }
  const std::string& path() const override { return path_; }
  const ModelConfig& config() const override { return config_; }
  const std::map<std::string, TensorView, std::less<>>& tensors() const override {
    return tensors_;
  }
  void DropPages(const TensorView& tensor) const override {
    for (const std::unique_ptr<SafetensorsFile>& shard : shards_) {  // the one it is in
      shard->file().DropPages(tensor.data, static_cast<size_t>(tensor.num_bytes));
    }
  }

  std::string path_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, TensorView, std::less<>> tensors_;
};

}  // namespace

namespace {

absl::StatusOr<std::unique_ptr<Checkpoint>> OpenHf(const std::string& directory,
                                                   bool with_tensors) {
  const fs::path dir(directory);
  auto checkpoint = std::make_unique<HfCheckpoint>();
  checkpoint->path_ = directory;

  absl::StatusOr<json> config = ReadJsonFile(dir / "config.json");
  if (!config.ok()) return config.status();
  std::optional<json> generation_config;
  std::error_code ec;
  if (fs::exists(dir / "generation_config.json", ec)) {
    absl::StatusOr<json> parsed = ReadJsonFile(dir / "generation_config.json");
    if (!parsed.ok()) return parsed.status();
    generation_config = *std::move(parsed);
  }
  absl::StatusOr<ModelConfig> model_config =
      ParseHfConfig(*config, generation_config ? &*generation_config : nullptr);
  if (!model_config.ok()) {
    return absl::Status(model_config.status().code(),
                        StrCat((dir / "config.json").string(), ": ",
                                     model_config.status().message()));
  }
  checkpoint->config_ = *std::move(model_config);
  if (checkpoint->config_.name.empty()) checkpoint->config_.name = dir.filename().string();
  if (checkpoint->config_.name.empty()) checkpoint->config_.name = dir.parent_path().filename();
  if (!with_tensors) return checkpoint;

  // The shards: one file, or those the index names.
  std::vector<std::string> shard_names;
  if (fs::exists(dir / "model.safetensors", ec)) {
    shard_names.push_back("model.safetensors");
  } else if (fs::exists(dir / "model.safetensors.index.json", ec)) {
    absl::StatusOr<json> index = ReadJsonFile(dir / "model.safetensors.index.json");
    if (!index.ok()) return index.status();
    auto weight_map = index->find("weight_map");
    if (weight_map == index->end() || !weight_map->is_object()) {
      return absl::InvalidArgumentError(StrCat(
          (dir / "model.safetensors.index.json").string(), ": no weight_map object"));
    }
    std::set<std::string> unique;
    for (const auto& [tensor, file] : weight_map->items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos) {
        return absl::InvalidArgumentError(
            StrCat((dir / "model.safetensors.index.json").string(), ": tensor '", tensor,
                         "' maps to a bad file name"));
      }
      unique.insert(file.get<std::string>());
    }
    shard_names.assign(unique.begin(), unique.end());
  } else {
    return absl::NotFoundError(StrCat(
        directory, ": no model.safetensors or model.safetensors.index.json"));
  }

  for (const std::string& name : shard_names) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> shard =
        SafetensorsFile::Open((dir / name).string());
    if (!shard.ok()) return shard.status();
    for (const auto& [tensor_name, view] : (*shard)->tensors()) {
      if (!checkpoint->tensors_.emplace(tensor_name, view).second) {
        return absl::InvalidArgumentError(StrCat(
            (dir / name).string(), ": tensor '", tensor_name, "' also appears in another shard"));
      }
    }
    checkpoint->shards_.push_back(*std::move(shard));
  }
  LMSERVE_RETURN_IF_ERROR(ValidateCheckpointTensors(*checkpoint));
  return checkpoint;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> OpenHfCheckpoint(const std::string& directory) {
  return OpenHf(directory, /*with_tensors=*/true);
}

absl::StatusOr<std::unique_ptr<Checkpoint>> OpenConfigOnlyCheckpoint(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return OpenHf(path, /*with_tensors=*/false);
  if (fs::path(path).filename() == "config.json") {
    const std::string dir = fs::path(path).parent_path().string();
    return OpenHf(dir.empty() ? "." : dir, /*with_tensors=*/false);
  }
  return OpenCheckpoint(path);  // a GGUF file: its metadata holds the configuration
}

}  // namespace lmserve::engine
