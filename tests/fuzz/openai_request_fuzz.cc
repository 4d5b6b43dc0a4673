// libFuzzer: arbitrary bytes as the body of an OpenAI-compatible API request (server/openai_api.h),
// then, for what parses, the conversion and checks every front end shares (request_convert.h)
// against a model without a tokenizer, the error's OpenAI shape and the JSON written back. Any
// input must end in a request or an error status, never a crash, a hang or a leak. The first byte
// picks the route: /v1/completions, /v1/chat/completions, /tokenize or /detokenize. (The HTTP
// framing below the body is Boost.Beast's parser, fuzzed upstream.)
// Seeds: tests/fuzz/corpus/openai_request_fuzz/.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "server/model_text.h"
#include "server/openai_api.h"
#include "server/request_convert.h"

namespace {

using namespace lmserve::server;  // NOLINT: a fuzzer's one function

void Check(const absl::Status& status) {
  if (status.ok()) return;
  const ApiError error = ToApiError(status);
  const std::string body = DumpJson(ErrorJson(error));
  if (body.empty() || error.http_status < 400) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const std::unique_ptr<ModelText> text = ModelText::None();
  lmserve::engine::RequestLimits limits;
  limits.vocab_size = 1000;
  limits.max_context_tokens = 256;
  limits.kv_cache_tokens = 4096;
  limits.max_logprobs = 20;
  limits.max_n = 16;
  const ApiLimits api;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
    case 1: {
      const OpenAiEndpoint endpoint =
          data[0] % 4 == 0 ? OpenAiEndpoint::kCompletions : OpenAiEndpoint::kChatCompletions;
      absl::StatusOr<GenerationRequest> request = ParseGenerationRequest(endpoint, body);
      if (!request.ok()) {
        Check(request.status());
        return 0;
      }
      if (endpoint == OpenAiEndpoint::kCompletions) {
        for (size_t i = 0; i < request->prompts.size(); ++i) {
          absl::StatusOr<PreparedRequest> prepared =
              PrepareCompleteRequest(request->prompts[i], *text, limits, api);
          if (!prepared.ok()) {
            Check(ToOpenAiFieldNames(prepared.status(), *request, static_cast<int>(i)));
          } else if (!lmserve::engine::ValidateRequest(prepared->request, limits).ok()) {
            __builtin_trap();  // what request_convert passes, the engine must accept
          }
        }
      } else {
        Check(ToOpenAiFieldNames(PrepareChatRequest(request->chat, *text, limits, api).status(),
                                 *request, 0));
      }
      break;
    }
    case 2:
      Check(ParseTokenizeRequest(body).status());
      break;
    case 3:
      Check(ParseDetokenizeRequest(body).status());
      break;
  }
  return 0;
}
