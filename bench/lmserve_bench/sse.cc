#include "bench/lmserve_bench/sse.h"

#include <nlohmann/json.hpp>

#include "common/strings.h"

namespace lmserve::bench {

std::vector<std::string> SseParser::Feed(std::string_view bytes) {
  std::vector<std::string> events;
  for (char c : bytes) {
    if (c == '\n' && last_was_cr_) {  // the second half of "\r\n"
      last_was_cr_ = false;
      continue;
    }
    last_was_cr_ = c == '\r';
    if (c == '\n' || c == '\r') {
      ProcessLine(pending_, &events);
      pending_.clear();
    } else {
      pending_.push_back(c);
    }
  }
  return events;
}

void SseParser::ProcessLine(std::string_view line, std::vector<std::string>* events) {
  if (line.empty()) {  // dispatch
    if (has_data_) events->push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line.front() == ':') return;  // a comment (keep-alive)
  const size_t colon = line.find(':');
  const std::string_view field = line.substr(0, colon);
  std::string_view value;
  if (colon != std::string_view::npos) {
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field != "data") return;
  if (has_data_) data_.push_back('\n');
  data_.append(value);
  has_data_ = true;
}

absl::StatusOr<CompletionChunk> ParseCompletionChunk(const std::string& data) {
  CompletionChunk chunk;
  if (data == "[DONE]") {
    chunk.done = true;
    return chunk;
  }
  const nlohmann::json object = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!object.is_object()) {
    return absl::InvalidArgumentError(
        StrCat("a stream chunk is not a JSON object: ", data.substr(0, 200)));
  }
  if (object.contains("error")) {
    const nlohmann::json& error = object["error"];
    chunk.error = error.is_object() && error.contains("message") && error["message"].is_string()
                      ? error["message"].get<std::string>()
                      : error.dump();
    return chunk;
  }
  if (object.contains("choices") && object["choices"].is_array() && !object["choices"].empty()) {
    const nlohmann::json& choice = object["choices"][0];
    chunk.has_choice = true;
    if (choice.contains("text") && choice["text"].is_string()) {
      chunk.text = choice["text"].get<std::string>();
    }
    if (choice.contains("token_ids") && choice["token_ids"].is_array()) {
      chunk.num_tokens = static_cast<int32_t>(choice["token_ids"].size());
    }
  }
  if (object.contains("usage") && object["usage"].is_object()) {
    const nlohmann::json& usage = object["usage"];
    if (usage.contains("prompt_tokens") && usage["prompt_tokens"].is_number_integer()) {
      chunk.usage_prompt_tokens = usage["prompt_tokens"].get<int32_t>();
    }
    if (usage.contains("completion_tokens") && usage["completion_tokens"].is_number_integer()) {
      chunk.usage_completion_tokens = usage["completion_tokens"].get<int32_t>();
    }
  }
  return chunk;
}

}  // namespace lmserve::bench
