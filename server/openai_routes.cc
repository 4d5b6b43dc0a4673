#include "server/openai_routes.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "common/status.h"
#include "common/strings.h"
#include "server/log.h"
#include "server/openai_api.h"
#include "server/request_convert.h"
#include "server/tool_calls.h"

namespace lmserve::server {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kRoutes[] = {
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/tokenize", "/detokenize"};

std::string_view PathOf(std::string_view target) {
  const size_t query = target.find('?');
  return query == std::string_view::npos ? target : target.substr(0, query);
}

Json UsageJson(int64_t prompt_tokens, int64_t completion_tokens, int64_t cached_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
}

class GenerationExchange;

// One prompt's engine request, its outputs handed to the exchange on the connection's strand.
class HttpCall final : public GenerationCall {
 public:
  HttpCall(ServingCore* core, std::string_view method, GenerationExchange* exchange,
           int prompt_index)
      : GenerationCall(core, FrontEnd::kHttp, method),
        exchange_(exchange),
        prompt_index_(prompt_index) {}

 protected:
  bool ReadyForOutputs() override;
  void Deliver(std::vector<engine::RequestOutput> outputs) override;

 private:
  GenerationExchange* const exchange_;
  const int prompt_index_;
};

// A /v1/completions or /v1/chat/completions request in progress: its calls (one per prompt) and
// the response they make. Runs on the connection's strand.
class GenerationExchange final : public HttpExchange {
 public:
  GenerationExchange(OpenAiRoutes* routes, HttpResponder* responder, std::string_view route,
                     GenerationRequest request)
      : routes_(routes),
        responder_(responder),
        route_(route),
        request_(std::move(request)),
        chat_(request_.endpoint == OpenAiEndpoint::kChatCompletions),
        created_(absl::ToUnixSeconds(absl::Now())) {}

  ~GenerationExchange() override {
    for (std::unique_ptr<HttpCall>& call : calls_) {
      if (!call->all_finished()) call->AbortRequest(/*for_drain=*/false);
      call->Detach();
    }
  }

  // Prepares every prompt (a bad one fails the request before anything is submitted), then
  // submits them. Returns false when it has answered with an error.
  bool Start() {
    ServingModel& model = routes_->core()->model();
    ApiLimits api = routes_->core()->api_limits();
    if (chat_ && !request_.chat.sampling().has_max_tokens()) {
      api.default_max_tokens = 0;  // chat completions generate up to the context by default
    }
    std::vector<PreparedRequest> prepared;
    const int num_prompts = chat_ ? 1 : static_cast<int>(request_.prompts.size());
    for (int i = 0; i < num_prompts; ++i) {
      absl::StatusOr<PreparedRequest> one =
          chat_ ? PrepareChatRequest(request_.chat, *model.text, model.engine->limits(), api)
                : PrepareCompleteRequest(request_.prompts[i], *model.text, model.engine->limits(),
                                         api);
      if (!one.ok()) {
        routes_->RespondError(responder_, route_, ToOpenAiFieldNames(one.status(), request_, i));
        return false;
      }
      prepared.push_back(*std::move(one));
    }
    num_samples_ = prepared.front().request.sampling.n;
    if (chat_) tool_format_ = prepared.front().tool_call_format;
    std::function<void(std::function<void()>)> poster = responder_->Poster();
    for (int i = 0; i < num_prompts; ++i) {
      auto call = std::make_unique<HttpCall>(routes_->core(), route_, this, i);
      const absl::Status status =
          call->Begin([&prepared, i] { return std::move(prepared[i]); }, poster);
      if (!status.ok()) {
        routes_->RespondError(responder_, route_, status);
        return false;  // the destructor aborts and detaches the calls submitted so far
      }
      calls_.push_back(std::move(call));
    }
    const HttpCall& first = *calls_.front();
    id_ = StrCat(chat_ ? "chatcmpl-" : "cmpl-", first.prepared().request_id.empty()
                                                    ? StrCat(first.engine_request_id())
                                                    : first.prepared().request_id);
    model_name_ = model.info.name();
    choices_.resize(static_cast<size_t>(num_prompts) * num_samples_);
    prompt_logprobs_.resize(num_prompts);
    if (request_.stream) responder_->StartEvents();
    return true;
  }

  bool HasRoom() const { return gone_ || !request_.stream || responder_->HasRoom(); }

  void OnRoom() override {
    for (std::unique_ptr<HttpCall>& call : calls_) call->OnEngineOutputs();
  }

  void OnClientGone() override {
    if (gone_ || ended_) return;
    gone_ = true;
    for (std::unique_ptr<HttpCall>& call : calls_) call->AbortRequest(/*for_drain=*/false);
    routes_->Count(route_, 499);
  }

  void OnOutputs(int prompt_index, std::vector<engine::RequestOutput> outputs) {
    if (gone_ || ended_) return;
    const ModelText& text = *routes_->core()->model().text;
    for (const engine::RequestOutput& output : outputs) {
      if (!output.prompt_logprobs.empty()) prompt_logprobs_[prompt_index] = output.prompt_logprobs;
    }
    if (request_.stream) {
      StreamOutputs(prompt_index, outputs, text);
    } else {
      for (engine::RequestOutput& output : outputs) {
        Choice& choice = choices_[ChoiceIndex(prompt_index, output.sample_index)];
        BeginChoice(prompt_index, &choice, text);
        choice.text += output.text;
        choice.token_ids.insert(choice.token_ids.end(), output.token_ids.begin(),
                                output.token_ids.end());
        AppendLogprobs(output.logprobs, text, &choice);
        if (output.finished) FinishChoice(output, &choice);
      }
    }
    if (std::all_of(calls_.begin(), calls_.end(),
                    [](const std::unique_ptr<HttpCall>& call) { return call->all_finished(); })) {
      End();
    }
  }

 private:
  struct Choice {
    bool begun = false;
    std::string text;
    std::vector<int32_t> token_ids;
    Json logprobs;  // null when not asked for
    int64_t text_offset = 0;
    bool finished = false;
    std::string finish_reason;
    Json stop_reason;
  };

  std::optional<ToolCallFormat> tool_format_;  // chat with tools: their calls are parsed
  int64_t next_call_ = 0;

  size_t ChoiceIndex(int prompt_index, int32_t sample_index) const {
    return static_cast<size_t>(prompt_index) * num_samples_ + sample_index;
  }

  // The start of a choice: the echoed prompt (text and logprobs) of completions.
  void BeginChoice(int prompt_index, Choice* choice, const ModelText& text) {
    if (choice->begun) return;
    choice->begun = true;
    if (chat_ || !request_.echo) return;
    const PreparedRequest& prepared = calls_[prompt_index]->prepared();
    choice->text = prepared.echo_text;
    if (request_.logprobs.has_value()) {
      // The prompt's first token has no logprob; the others' came with sample 0's first output.
      const std::vector<int32_t>& prompt = prepared.request.prompt_token_ids;
      choice->logprobs = Json::object();
      std::vector<const engine::PositionLogprobs*> positions;
      AppendCompletionLogprobs(positions, text, 0, &choice->text_offset, &choice->logprobs);
      const std::string first = LogprobTokenText(text, prompt.front());
      choice->logprobs["tokens"].push_back(first);
      choice->logprobs["token_logprobs"].push_back(nullptr);
      choice->logprobs["top_logprobs"].push_back(nullptr);
      choice->logprobs["text_offset"].push_back(0);
      choice->text_offset = static_cast<int64_t>(first.size());
      for (const engine::PositionLogprobs& position : prompt_logprobs_[prompt_index]) {
        positions.push_back(&position);
      }
      AppendCompletionLogprobs(positions, text, *request_.logprobs, &choice->text_offset,
                               &choice->logprobs);
    }
  }

  void AppendLogprobs(const std::vector<engine::PositionLogprobs>& logprobs, const ModelText& text,
                      Choice* choice) {
    if (!request_.logprobs.has_value() || logprobs.empty()) return;
    if (chat_) {
      AppendChatLogprobs(logprobs, text, *request_.logprobs, &choice->logprobs);
      return;
    }
    std::vector<const engine::PositionLogprobs*> positions;
    positions.reserve(logprobs.size());
    for (const engine::PositionLogprobs& position : logprobs) positions.push_back(&position);
    AppendCompletionLogprobs(positions, text, *request_.logprobs, &choice->text_offset,
                             &choice->logprobs);
  }

  void FinishChoice(const engine::RequestOutput& output, Choice* choice) {
    choice->finished = true;
    choice->finish_reason = std::string(OpenAiFinishReason(output.finish_reason));
    choice->stop_reason =
        OpenAiStopReason(output.finish_reason, output.stop_string, output.stop_token_id);
  }

  Json ChoiceLogprobs(const Choice& choice) const {
    if (!request_.logprobs.has_value()) return nullptr;
    if (choice.logprobs.is_null()) return chat_ ? Json{{"content", Json::array()}} : Json(nullptr);
    return choice.logprobs;
  }

  // One event per choice that has new output, in order of first appearance.
  // The tool calls in a finished chat choice's text (OpenAI's message.tool_calls, or a delta's
  // with indexes), or null when tools are off or it holds none; `*content` is what remains.
  Json ToolCallsJson(const std::string& text, bool with_index, Json* content) {
    if (!tool_format_.has_value()) return nullptr;
    std::string rest;
    std::optional<std::vector<ParsedToolCall>> calls = ParseToolCalls(text, *tool_format_, &rest);
    if (!calls.has_value()) return nullptr;
    Json out = Json::array();
    for (size_t k = 0; k < calls->size(); ++k) {
      Json call = {{"id", StrCat("call_", id_.substr(id_.find('-') + 1), "_", next_call_++)},
                   {"type", "function"},
                   {"function", {{"name", (*calls)[k].name}, {"arguments", (*calls)[k].arguments}}}};
      if (with_index) call["index"] = k;
      out.push_back(std::move(call));
    }
    *content = rest.empty() ? Json(nullptr) : Json(rest);
    return out;
  }

  void StreamOutputs(int prompt_index, const std::vector<engine::RequestOutput>& outputs,
                     const ModelText& text) {
    std::vector<size_t> order;
    std::map<size_t, Choice> pieces;  // this batch's part of each choice
    for (const engine::RequestOutput& output : outputs) {
      const size_t index = ChoiceIndex(prompt_index, output.sample_index);
      auto [it, inserted] = pieces.try_emplace(index);
      if (inserted) order.push_back(index);
      Choice& piece = it->second;
      Choice& choice = choices_[index];
      if (!choice.begun) {
        BeginChoice(prompt_index, &choice, text);
        piece.begun = true;        // this event starts the choice
        piece.text = choice.text;  // the echo, if any
        piece.logprobs = choice.logprobs;
        choice.text.clear();
        choice.logprobs = Json();
      }
      piece.text += output.text;
      if (tool_format_.has_value()) {
        // With tools, a choice's text is held until it ends: then it is content or tool calls.
        choice.text += piece.text;
        piece.text.clear();
        if (output.finished) piece.text = choice.text;
      }
      piece.token_ids.insert(piece.token_ids.end(), output.token_ids.begin(),
                             output.token_ids.end());
      if (request_.logprobs.has_value() && !output.logprobs.empty()) {
        if (chat_) {
          AppendChatLogprobs(output.logprobs, text, *request_.logprobs, &piece.logprobs);
        } else {
          std::vector<const engine::PositionLogprobs*> positions;
          for (const engine::PositionLogprobs& position : output.logprobs) {
            positions.push_back(&position);
          }
          AppendCompletionLogprobs(positions, text, *request_.logprobs, &choice.text_offset,
                                   &piece.logprobs);
        }
      }
      if (output.finished) {
        FinishChoice(output, &piece);
        choice.finished = true;
      }
    }
    std::string events;
    for (size_t index : order) {
      const Choice& piece = pieces[index];
      Json out = {{"index", index}};
      std::string finish_reason = piece.finish_reason;
      if (chat_) {
        Json delta = Json::object();
        if (piece.begun) delta["role"] = "assistant";
        Json content = piece.text;
        Json calls = piece.finished ? ToolCallsJson(piece.text, true, &content) : Json(nullptr);
        if (!calls.is_null()) {
          if (!content.is_null()) delta["content"] = content;
          delta["tool_calls"] = std::move(calls);
          if (finish_reason == "stop") finish_reason = "tool_calls";
        } else if (!piece.text.empty() || piece.begun) {
          delta["content"] = piece.text;
        }
        out["delta"] = std::move(delta);
      } else {
        out["text"] = piece.text;
      }
      out["logprobs"] = request_.logprobs.has_value() && !piece.logprobs.is_null() ? piece.logprobs
                                                                                   : Json(nullptr);
      out["finish_reason"] = piece.finished ? Json(finish_reason) : Json(nullptr);
      if (piece.finished) out["stop_reason"] = piece.stop_reason;
      if (request_.return_token_ids) {
        out["token_ids"] = piece.token_ids;
        if (piece.begun) {
          out["prompt_token_ids"] =
              calls_[index / num_samples_]->prepared().request.prompt_token_ids;
        }
      }
      events += SseEvent(ChunkJson(Json::array({std::move(out)})));
    }
    responder_->SendEvents(events);
  }

  Json ChunkJson(Json choices) const {
    Json chunk = {{"id", id_},
                  {"object", chat_ ? "chat.completion.chunk" : "text_completion"},
                  {"created", created_},
                  {"model", model_name_},
                  {"choices", std::move(choices)}};
    if (request_.include_usage) chunk["usage"] = nullptr;
    return chunk;
  }

  Json Usage() const {
    int64_t prompt = 0;
    int64_t completion = 0;
    int64_t cached = 0;
    for (const std::unique_ptr<HttpCall>& call : calls_) {
      prompt += call->prompt_tokens();
      completion += call->generation_tokens();
      cached += call->cached_tokens();
    }
    return UsageJson(prompt, completion, cached);
  }

  absl::Status FinalStatus() const {
    for (const std::unique_ptr<HttpCall>& call : calls_) {
      absl::Status status = call->FinalStatus();
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  }

  // Every choice has finished: the response's end.
  void End() {
    ended_ = true;
    const absl::Status status = FinalStatus();
    for (std::unique_ptr<HttpCall>& call : calls_) call->LogEnd(status);
    if (request_.stream) {
      std::string events;
      if (!status.ok()) {
        events += SseEvent(ErrorJson(ToApiError(status)));
      } else if (request_.include_usage) {
        Json usage = ChunkJson(Json::array());
        usage["usage"] = Usage();
        events += SseEvent(usage);
      }
      events += kSseDone;
      responder_->SendEvents(events);
      responder_->EndEvents();
      routes_->Count(route_, 200);
      return;
    }
    if (!status.ok()) {
      routes_->RespondError(responder_, route_, status);
      return;
    }
    Json choices = Json::array();
    for (size_t index = 0; index < choices_.size(); ++index) {
      const Choice& choice = choices_[index];
      Json out = {{"index", index}};
      std::string finish_reason = choice.finish_reason;
      if (chat_) {
        out["message"] = {{"role", "assistant"}, {"content", choice.text}};
        Json content;
        Json calls = ToolCallsJson(choice.text, false, &content);
        if (!calls.is_null()) {
          out["message"]["content"] = std::move(content);
          out["message"]["tool_calls"] = std::move(calls);
          if (finish_reason == "stop") finish_reason = "tool_calls";
        }
      } else {
        out["text"] = choice.text;
      }
      out["logprobs"] = ChoiceLogprobs(choice);
      out["finish_reason"] = finish_reason;
      out["stop_reason"] = choice.stop_reason;
      if (request_.return_token_ids) {
        out["token_ids"] = choice.token_ids;
        if (!chat_) {
          out["prompt_token_ids"] =
              calls_[index / num_samples_]->prepared().request.prompt_token_ids;
        }
      }
      choices.push_back(std::move(out));
    }
    Json response = {{"id", id_},
                     {"object", chat_ ? "chat.completion" : "text_completion"},
                     {"created", created_},
                     {"model", model_name_},
                     {"choices", std::move(choices)},
                     {"usage", Usage()}};
    if (chat_ && request_.return_token_ids) {
      response["prompt_token_ids"] = calls_.front()->prepared().request.prompt_token_ids;
    }
    responder_->Respond(200, "application/json", DumpJson(response));
    routes_->Count(route_, 200);
  }

  OpenAiRoutes* const routes_;
  HttpResponder* const responder_;
  const std::string_view route_;
  const GenerationRequest request_;
  const bool chat_;
  const int64_t created_;
  std::vector<std::unique_ptr<HttpCall>> calls_;
  int32_t num_samples_ = 1;
  std::string id_;
  std::string model_name_;
  std::vector<Choice> choices_;                                         // [prompt][sample]
  std::vector<std::vector<engine::PositionLogprobs>> prompt_logprobs_;  // per prompt, with echo
  bool gone_ = false;
  bool ended_ = false;
};

bool HttpCall::ReadyForOutputs() { return exchange_->HasRoom(); }

void HttpCall::Deliver(std::vector<engine::RequestOutput> outputs) {
  exchange_->OnOutputs(prompt_index_, std::move(outputs));
}

}  // namespace

std::string_view HttpRouteLabel(std::string_view target) {
  const std::string_view path = PathOf(target);
  for (std::string_view route : kRoutes) {
    if (path == route) return route;
  }
  return "other";
}

OpenAiRoutes::OpenAiRoutes(ServingCore* core)
    : core_(core), created_unix_seconds_(absl::ToUnixSeconds(absl::Now())) {}

void OpenAiRoutes::Count(std::string_view route, int http_status) {
  if (Metrics* metrics = core_->metrics(); metrics != nullptr) {
    metrics->CountHttpRequest(route, http_status);
  }
}

namespace {

void RespondApiError(HttpResponder* responder, const ApiError& error) {
  HttpHeaders headers;
  if (error.http_status == 401) headers.emplace_back("WWW-Authenticate", "Bearer");
  responder->Respond(error.http_status, "application/json", DumpJson(ErrorJson(error)), headers);
}

}  // namespace

void OpenAiRoutes::RespondError(HttpResponder* responder, std::string_view route,
                                const absl::Status& status) {
  const ApiError error = ToApiError(status);
  Count(route, error.http_status);
  RespondApiError(responder, error);
}

absl::Status OpenAiRoutes::CheckModel(const std::string& model) {
  const std::string& served = core_->model().info.name();
  if (model.empty() || model == served) return absl::OkStatus();
  return absl::NotFoundError(StrCat("model: the model '", model.substr(0, 200),
                                    "' does not exist; this server serves '", served, "'"));
}

std::unique_ptr<HttpExchange> OpenAiRoutes::Handle(HttpRequest request, HttpResponder* responder) {
  const std::string_view route = HttpRouteLabel(request.target);
  if (request.transport_error_status != 0) {
    const ApiError error =
        HttpError(request.transport_error_status, std::move(request.transport_error_message));
    Count(route, error.http_status);
    RespondApiError(responder, error);
    return nullptr;
  }
  const std::string_view path = PathOf(request.target);
  auto method_not_allowed = [&](std::string_view allowed) {
    ApiError error = HttpError(405, StrCat("method ", request.method.substr(0, 20),
                                           " is not allowed on ", path, "; use ", allowed));
    Count(route, 405);
    responder->Respond(405, "application/json", DumpJson(ErrorJson(error)),
                       {{"Allow", std::string(allowed)}});
    return nullptr;
  };
  const bool get = request.method == "GET" || request.method == "HEAD";
  if (route == "/health") {
    if (!get) return method_not_allowed("GET");
    const absl::Status serving = core_->CheckServing();
    if (!serving.ok()) {
      RespondError(responder, route, serving);
    } else {
      Count(route, 200);
      responder->Respond(200, "text/plain", "");
    }
    return nullptr;
  }
  if (route == "other") {
    const ApiError error = HttpError(
        404, StrCat("Invalid URL (", request.method.substr(0, 20), " ", path.substr(0, 200), ")"));
    Count(route, 404);
    RespondApiError(responder, error);
    return nullptr;
  }
  const bool is_models = route == "/v1/models";
  if (is_models ? !get : request.method != "POST") {
    return method_not_allowed(is_models ? "GET" : "POST");
  }
  if (request.authorization_headers > 1) {
    // Which one a proxy or a peer would read is anyone's guess: refuse rather than pick one.
    RespondError(responder, route,
                 absl::UnauthenticatedError("more than one 'authorization' header"));
    return nullptr;
  }
  if (absl::Status status = core_->Authorize(request.authorization); !status.ok()) {
    RespondError(responder, route, status);
    return nullptr;
  }
  if (absl::Status status = core_->CheckServing(); !status.ok()) {
    RespondError(responder, route, status);
    return nullptr;
  }
  if (is_models) {
    HandleModels(route, responder);
    return nullptr;
  }
  if (route == "/tokenize") {
    HandleTokenize(route, request, responder);
    return nullptr;
  }
  if (route == "/detokenize") {
    HandleDetokenize(route, request, responder);
    return nullptr;
  }
  return HandleGeneration(route == "/v1/chat/completions" ? OpenAiEndpoint::kChatCompletions
                                                          : OpenAiEndpoint::kCompletions,
                          route, request, responder);
}

std::unique_ptr<HttpExchange> OpenAiRoutes::HandleGeneration(OpenAiEndpoint endpoint,
                                                             std::string_view route,
                                                             const HttpRequest& request,
                                                             HttpResponder* responder) {
  absl::StatusOr<GenerationRequest> parsed = ParseGenerationRequest(endpoint, request.body);
  if (!parsed.ok()) {
    RespondError(responder, route, parsed.status());
    return nullptr;
  }
  if (absl::Status status = CheckModel(parsed->model); !status.ok()) {
    RespondError(responder, route, status);
    return nullptr;
  }
  auto exchange = std::make_unique<GenerationExchange>(this, responder, route, *std::move(parsed));
  if (!exchange->Start()) return nullptr;
  return exchange;
}

void OpenAiRoutes::HandleModels(std::string_view route, HttpResponder* responder) {
  const ServingModel& model = core_->model();
  const Json response = {{"object", "list"},
                         {"data", Json::array({{{"id", model.info.name()},
                                                {"object", "model"},
                                                {"created", created_unix_seconds_},
                                                {"owned_by", "lmserve"},
                                                {"root", model.info.name()},
                                                {"parent", nullptr},
                                                {"max_model_len", model.info.context_length()},
                                                // lmserve's: for clients that make token-id prompts
                                                {"vocab_size", model.info.vocab_size()}}})}};
  Count(route, 200);
  responder->Respond(200, "application/json", DumpJson(response));
}

void OpenAiRoutes::HandleTokenize(std::string_view route, const HttpRequest& request,
                                  HttpResponder* responder) {
  absl::StatusOr<TokenizeRequest> parsed = ParseTokenizeRequest(request.body);
  absl::Status status = parsed.status();
  if (status.ok()) status = CheckModel(parsed->model);
  if (!status.ok()) {
    RespondError(responder, route, status);
    return;
  }
  const ServingModel& model = core_->model();
  absl::StatusOr<std::vector<int32_t>> ids =
      parsed->prompt.has_value()
          ? TokenizeText("prompt", *parsed->prompt, parsed->add_special_tokens, *model.text)
          : RenderChatPrompt(parsed->chat, *model.text, core_->api_limits());
  if (!ids.ok()) {
    RespondError(responder, route, ids.status());
    return;
  }
  const Json response = {{"count", ids->size()},
                         {"max_model_len", model.info.context_length()},
                         {"tokens", *ids},
                         {"token_strs", nullptr}};
  Count(route, 200);
  responder->Respond(200, "application/json", DumpJson(response));
}

void OpenAiRoutes::HandleDetokenize(std::string_view route, const HttpRequest& request,
                                    HttpResponder* responder) {
  absl::StatusOr<DetokenizeRequest> parsed = ParseDetokenizeRequest(request.body);
  absl::Status status = parsed.status();
  if (status.ok()) status = CheckModel(parsed->model);
  if (!status.ok()) {
    RespondError(responder, route, status);
    return;
  }
  const ServingModel& model = core_->model();
  absl::StatusOr<std::string> text = DetokenizeIds("tokens", parsed->tokens, /*skip_special=*/false,
                                                   *model.text, model.engine->limits().vocab_size);
  if (!text.ok()) {
    RespondError(responder, route, text.status());
    return;
  }
  Count(route, 200);
  responder->Respond(200, "application/json", DumpJson(Json{{"prompt", *text}}));
}

}  // namespace lmserve::server
