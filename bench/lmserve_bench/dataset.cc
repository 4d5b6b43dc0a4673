#include "bench/lmserve_bench/dataset.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/file.h"
#include "common/status.h"
#include "common/strings.h"

namespace lmserve::bench {
namespace {

absl::StatusOr<int32_t> PositiveInt(const nlohmann::json& value, const std::string& where) {
  if (!value.is_number_integer() || value.get<int64_t>() < 1 || value.get<int64_t>() > INT32_MAX) {
    return absl::InvalidArgumentError(StrCat(where, ": want a positive integer"));
  }
  return static_cast<int32_t>(value.get<int64_t>());
}

}  // namespace

absl::StatusOr<std::vector<Prompt>> ParseJsonlDataset(const std::string& contents,
                                                      int32_t default_output_tokens) {
  std::vector<Prompt> prompts;
  std::istringstream lines(contents);
  std::string line;
  int line_number = 0;
  while (std::getline(lines, line)) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = StrCat("line ", line_number);
    nlohmann::json object = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!object.is_object()) {
      return absl::InvalidArgumentError(StrCat(where, ": not a JSON object"));
    }
    Prompt prompt;
    prompt.output_tokens = default_output_tokens;
    if (object.contains("prompt") && object.contains("prompt_token_ids")) {
      return absl::InvalidArgumentError(
          StrCat(where, ": give either \"prompt\" or \"prompt_token_ids\""));
    }
    if (object.contains("prompt")) {
      if (!object["prompt"].is_string() || object["prompt"].get<std::string>().empty()) {
        return absl::InvalidArgumentError(StrCat(where, ": \"prompt\" must be a non-empty string"));
      }
      prompt.text = object["prompt"].get<std::string>();
    } else if (object.contains("prompt_token_ids")) {
      const nlohmann::json& ids = object["prompt_token_ids"];
      if (!ids.is_array() || ids.empty()) {
        return absl::InvalidArgumentError(
            StrCat(where, ": \"prompt_token_ids\" must be a non-empty array"));
      }
      for (const nlohmann::json& id : ids) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
          return absl::InvalidArgumentError(
              StrCat(where, ": \"prompt_token_ids\" must hold non-negative integers"));
        }
        prompt.token_ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
      }
      prompt.input_tokens = static_cast<int32_t>(prompt.token_ids.size());
    } else {
      return absl::InvalidArgumentError(StrCat(where, ": no \"prompt\" or \"prompt_token_ids\""));
    }
    for (const char* key : {"output_len", "max_tokens", "output_tokens"}) {
      if (!object.contains(key)) continue;
      LMSERVE_ASSIGN_OR_RETURN(int32_t value,
                               PositiveInt(object[key], StrCat(where, ": \"", key, "\"")));
      prompt.output_tokens = value;
      break;
    }
    if (object.contains("input_len") && prompt.token_ids.empty()) {
      LMSERVE_ASSIGN_OR_RETURN(int32_t value,
                               PositiveInt(object["input_len"], StrCat(where, ": input_len")));
      prompt.input_tokens = value;
    }
    if (prompt.output_tokens < 1) {
      return absl::InvalidArgumentError(StrCat(where, ": no output length and no default"));
    }
    prompts.push_back(std::move(prompt));
  }
  if (prompts.empty()) return absl::InvalidArgumentError("the dataset holds no prompts");
  return prompts;
}

absl::StatusOr<std::vector<Prompt>> ReadJsonlDataset(const std::string& path,
                                                     int32_t default_output_tokens) {
  absl::StatusOr<std::string> contents = ReadFile(path);
  if (!contents.ok()) {
    return absl::Status(contents.status().code(),
                        StrCat("the dataset: ", contents.status().message()));
  }
  absl::StatusOr<std::vector<Prompt>> prompts = ParseJsonlDataset(*contents, default_output_tokens);
  if (!prompts.ok()) {
    return absl::InvalidArgumentError(StrCat(path, ": ", prompts.status().message()));
  }
  return prompts;
}

absl::StatusOr<std::vector<Prompt>> MakeSyntheticDataset(const SyntheticSpec& spec) {
  if (spec.num_prompts < 1) return absl::InvalidArgumentError("want at least one prompt");
  if (spec.input_len < 1 || spec.output_len < 1) {
    return absl::InvalidArgumentError("input and output lengths must be >= 1");
  }
  if (!(spec.range_ratio >= 0 && spec.range_ratio < 1)) {
    return absl::InvalidArgumentError("--range-ratio must be in [0, 1)");
  }
  if (spec.first_id < 0 || spec.vocab_size <= spec.first_id) {
    return absl::InvalidArgumentError(
        StrCat("the vocabulary [", spec.first_id, ", ", spec.vocab_size, ") is empty"));
  }
  std::mt19937_64 generator(spec.seed);
  auto length = [&](int32_t len) {
    const int32_t low =
        std::max<int32_t>(1, static_cast<int32_t>(std::floor(len * (1 - spec.range_ratio))));
    const int32_t high =
        std::max(low, static_cast<int32_t>(std::ceil(len * (1 + spec.range_ratio))));
    return std::uniform_int_distribution<int32_t>(low, high)(generator);
  };
  std::uniform_int_distribution<int32_t> id(spec.first_id, spec.vocab_size - 1);
  std::vector<Prompt> prompts(static_cast<size_t>(spec.num_prompts));
  for (Prompt& prompt : prompts) {
    prompt.input_tokens = length(spec.input_len);
    prompt.output_tokens = length(spec.output_len);
    prompt.token_ids.resize(static_cast<size_t>(prompt.input_tokens));
    for (int32_t& token : prompt.token_ids) token = id(generator);
  }
  return prompts;
}

}  // namespace lmserve::bench
