// Server-sent events (the WHATWG EventSource format) as OpenAI-compatible servers stream them, and
// the parts of an OpenAI /v1/completions stream chunk that the benchmark reads.

#ifndef LMSERVE_BENCH_LMSERVE_BENCH_SSE_H_
#define LMSERVE_BENCH_LMSERVE_BENCH_SSE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace lmserve::bench {

// An incremental parser: feed it bytes as they arrive, in pieces of any size; it returns each event
// once its terminating blank line has arrived. An event's data is its `data:` lines joined with
// "\n" (one space after the colon dropped); comments (":...") and other fields are ignored, and
// events without data are not returned. Lines end with "\n", "\r\n" or "\r".
class SseParser {
 public:
  std::vector<std::string> Feed(std::string_view bytes);

 private:
  void ProcessLine(std::string_view line, std::vector<std::string>* events);

  std::string pending_;  // an incomplete line
  bool last_was_cr_ = false;
  std::string data_;
  bool has_data_ = false;
};

// One /v1/completions stream chunk.
struct CompletionChunk {
  bool done = false;  // the "[DONE]" sentinel
  std::string text;   // choices[0].text ("" when the chunk has no choices)
  // Tokens in this chunk when the server says (choices[0].token_ids, as vLLM's return_token_ids
  // gives); nullopt otherwise.
  std::optional<int32_t> num_tokens;
  bool has_choice = false;
  std::optional<int32_t> usage_prompt_tokens;      // usage.prompt_tokens
  std::optional<int32_t> usage_completion_tokens;  // usage.completion_tokens
  std::string error;  // an "error" object's message, when the server streamed an error
};

absl::StatusOr<CompletionChunk> ParseCompletionChunk(const std::string& data);

}  // namespace lmserve::bench

#endif  // LMSERVE_BENCH_LMSERVE_BENCH_SSE_H_
