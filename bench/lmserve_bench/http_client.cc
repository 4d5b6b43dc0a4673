// The OpenAI-compatible HTTP transport: POST /v1/completions with "stream": true, read as
// server-sent events, on one libcurl multi handle driven by one thread.
//
// Tokens: a chunk's choices[0].token_ids where the server sends them; else the final chunk's
// usage.completion_tokens (asked for with stream_options.include_usage) gives the count and the
// chunks only time the ITL; else each non-empty text chunk counts as one token (vLLM's benchmark
// does the same). token_counting() says which happened.

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "bench/lmserve_bench/client.h"
#include "bench/lmserve_bench/sse.h"
#include "common/status.h"
#include "common/strings.h"

namespace lmserve::bench {
namespace {

constexpr size_t kMaxErrorBody = 200;

struct Transfer {
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  std::string body;
  SseParser parser;
  RequestRecord record;
  std::function<void(RequestRecord)> done;
  std::string error;
  std::string error_body;  // a non-200 answer's first bytes
  bool saw_done = false;
  bool saw_token_ids = false;
  std::optional<int32_t> usage_completion_tokens;

  ~Transfer() {
    if (easy != nullptr) curl_easy_cleanup(easy);
    if (headers != nullptr) curl_slist_free_all(headers);
  }
};

size_t CollectWrite(char* data, size_t size, size_t count, void* user) {
  static_cast<std::string*>(user)->append(data, size * count);
  return size * count;
}

class HttpClient : public Client {
 public:
  explicit HttpClient(const ClientOptions& options) : options_(options) {
    while (!options_.target.empty() && options_.target.back() == '/') options_.target.pop_back();
    multi_ = curl_multi_init();
    loop_ = std::thread([this] { Loop(); });
  }

  ~HttpClient() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    curl_multi_wakeup(multi_);
    loop_.join();
    curl_multi_cleanup(multi_);
  }

  absl::Status WaitReady(double timeout_seconds) override {
    const double deadline = NowSeconds() + timeout_seconds;
    std::string last = "no answer";
    do {
      for (const char* path : {"/health", "/v1/models"}) {
        absl::StatusOr<std::string> answer = HttpGet(StrCat(options_.target, path), 5);
        if (answer.ok()) return absl::OkStatus();
        last = std::string(answer.status().message());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    } while (NowSeconds() < deadline);
    return absl::UnavailableError(
        StrCat(options_.target, " was not ready within ", timeout_seconds, " s (", last, ")"));
  }

  absl::StatusOr<int32_t> VocabSize() override {
    absl::StatusOr<nlohmann::json> model = FirstModel();
    if (model.ok() && model->contains("vocab_size") && (*model)["vocab_size"].is_number_integer()) {
      return (*model)["vocab_size"].get<int32_t>();
    }
    return absl::UnimplementedError(
        "the server's /v1/models does not say the vocabulary size: give --vocab-size for "
        "synthetic prompts");
  }

  absl::StatusOr<std::string> Model() override {
    if (!options_.model.empty()) return options_.model;
    absl::StatusOr<nlohmann::json> model = FirstModel();
    if (!model.ok()) {
      return absl::UnavailableError(StrCat("--model not given, and the server's model is unknown: ",
                                           model.status().message()));
    }
    if (!model->contains("id") || !(*model)["id"].is_string()) {
      return absl::UnavailableError("--model not given, and /v1/models lists no model id");
    }
    options_.model = (*model)["id"].get<std::string>();
    return options_.model;
  }

  void Start(const Prompt& prompt, std::function<void(RequestRecord)> done) override {
    auto transfer = std::make_unique<Transfer>();
    nlohmann::json body = {{"model", options_.model},
                           {"max_tokens", prompt.output_tokens},
                           {"temperature", options_.temperature},
                           {"ignore_eos", options_.ignore_eos},
                           {"stream", true},
                           {"stream_options", {{"include_usage", true}}}};
    if (options_.return_token_ids) body["return_token_ids"] = true;
    if (!prompt.text.empty()) {
      body["prompt"] = prompt.text;
    } else {
      body["prompt"] = prompt.token_ids;
    }
    transfer->body = body.dump();
    transfer->done = std::move(done);
    transfer->record.prompt_tokens = prompt.input_tokens;
    transfer->record.expected_output_tokens = prompt.output_tokens;
    CURL* easy = curl_easy_init();
    transfer->easy = easy;
    transfer->headers = curl_slist_append(transfer->headers, "Content-Type: application/json");
    transfer->headers = curl_slist_append(transfer->headers, "Accept: text/event-stream");
    if (!options_.token.empty()) {
      transfer->headers = curl_slist_append(
          transfer->headers, StrCat("Authorization: Bearer ", options_.token).c_str());
    }
    const std::string url = StrCat(options_.target, options_.endpoint);  // libcurl copies it
    curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, transfer->headers);
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, transfer->body.c_str());
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE, static_cast<long>(transfer->body.size()));
    curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &HttpClient::Write);
    curl_easy_setopt(easy, CURLOPT_WRITEDATA, transfer.get());
    curl_easy_setopt(easy, CURLOPT_PRIVATE, transfer.get());
    curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(easy, CURLOPT_TCP_NODELAY, 1L);
    if (options_.request_timeout_seconds > 0) {
      curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS,
                       static_cast<long>(options_.request_timeout_seconds * 1e3));
    }
    transfer->record.send_time = NowSeconds();
    {
      std::lock_guard<std::mutex> lock(mu_);
      incoming_.push_back(std::move(transfer));
    }
    curl_multi_wakeup(multi_);
  }

  void CancelAll() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancel_ = true;
    }
    curl_multi_wakeup(multi_);
  }

  // data[0] of GET /v1/models.
  absl::StatusOr<nlohmann::json> FirstModel() {
    LMSERVE_ASSIGN_OR_RETURN(std::string text,
                             HttpGet(StrCat(options_.target, "/v1/models"), 10, options_.token));
    const nlohmann::json models = nlohmann::json::parse(text, nullptr, false);
    if (!models.is_object() || !models.contains("data") || !models["data"].is_array() ||
        models["data"].empty() || !models["data"][0].is_object()) {
      return absl::UnavailableError("GET /v1/models: no model listed");
    }
    return models["data"][0];
  }

  TokenCounting token_counting() const override {
    if (saw_token_ids_.load()) return TokenCounting::kTokenIds;
    if (saw_usage_.load()) return TokenCounting::kUsage;
    return TokenCounting::kChunks;
  }

 private:
  static size_t Write(char* data, size_t size, size_t count, void* user) {
    Transfer* transfer = static_cast<Transfer*>(user);
    const size_t bytes = size * count;
    const double now = NowSeconds();
    long code = 0;
    curl_easy_getinfo(transfer->easy, CURLINFO_RESPONSE_CODE, &code);
    if (code != 200) {
      const size_t room = kMaxErrorBody - std::min(kMaxErrorBody, transfer->error_body.size());
      transfer->error_body.append(data, std::min(room, bytes));
      return bytes;
    }
    for (const std::string& event : transfer->parser.Feed(std::string_view(data, bytes))) {
      absl::StatusOr<CompletionChunk> chunk = ParseCompletionChunk(event);
      if (!chunk.ok()) {
        if (transfer->error.empty()) transfer->error = std::string(chunk.status().message());
        continue;
      }
      if (chunk->done) {
        transfer->saw_done = true;
        continue;
      }
      if (!chunk->error.empty()) {
        if (transfer->error.empty()) transfer->error = StrCat("stream error: ", chunk->error);
        continue;
      }
      if (chunk->usage_completion_tokens.has_value()) {
        transfer->usage_completion_tokens = chunk->usage_completion_tokens;
      }
      if (chunk->usage_prompt_tokens.has_value() && *chunk->usage_prompt_tokens > 0) {
        transfer->record.prompt_tokens = *chunk->usage_prompt_tokens;
      }
      if (!chunk->has_choice) continue;
      int32_t tokens = 0;
      if (chunk->num_tokens.has_value()) {
        transfer->saw_token_ids = true;
        tokens = *chunk->num_tokens;
      } else {
        tokens = chunk->text.empty() ? 0 : 1;
      }
      AddChunk(&transfer->record, now, tokens);
    }
    return bytes;
  }

  void Finish(std::unique_ptr<Transfer> transfer, CURLcode result) {
    RequestRecord& record = transfer->record;
    record.end_time = NowSeconds();
    long code = 0;
    curl_easy_getinfo(transfer->easy, CURLINFO_RESPONSE_CODE, &code);
    if (result == CURLE_ABORTED_BY_CALLBACK) {  // only CancelAll ends transfers so
      record.error = kCancelledByClient;
    } else if (result != CURLE_OK) {
      record.error = StrCat("HTTP transport: ", curl_easy_strerror(result));
    } else if (code != 200) {
      record.error = StrCat("HTTP ", code, ": ", transfer->error_body.substr(0, 80));
    } else if (!transfer->error.empty()) {
      record.error = transfer->error;
    } else if (record.output_tokens == 0) {
      record.error = "the stream ended without a token";
    } else {
      record.success = true;
    }
    if (record.success && !transfer->saw_token_ids &&
        transfer->usage_completion_tokens.has_value()) {
      // The server's count is exact; the chunks stay what timed the ITL.
      record.output_tokens = *transfer->usage_completion_tokens;
      saw_usage_.store(true);
    }
    if (transfer->saw_token_ids) saw_token_ids_.store(true);
    std::function<void(RequestRecord)> done = std::move(transfer->done);
    RequestRecord finished = std::move(record);
    transfer.reset();  // `record` lived in it
    done(std::move(finished));
  }

  void Loop() {
    std::vector<std::unique_ptr<Transfer>> running;
    for (;;) {
      std::deque<std::unique_ptr<Transfer>> incoming;
      bool cancel = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        incoming.swap(incoming_);
        cancel = cancel_;
        cancel_ = false;
        if (stop_ && incoming.empty() && running.empty()) break;
        if (stop_) cancel = true;
      }
      for (auto& transfer : incoming) {
        curl_multi_add_handle(multi_, transfer->easy);
        running.push_back(std::move(transfer));
      }
      if (cancel) {
        for (auto& transfer : running) {
          curl_multi_remove_handle(multi_, transfer->easy);
          Finish(std::move(transfer), CURLE_ABORTED_BY_CALLBACK);
        }
        running.clear();
      }
      int still_running = 0;
      curl_multi_perform(multi_, &still_running);
      int queued = 0;
      while (CURLMsg* message = curl_multi_info_read(multi_, &queued)) {
        if (message->msg != CURLMSG_DONE) continue;
        CURL* easy = message->easy_handle;
        const CURLcode result = message->data.result;
        curl_multi_remove_handle(multi_, easy);
        auto it = std::find_if(running.begin(), running.end(),
                               [&](const auto& t) { return t->easy == easy; });
        if (it == running.end()) continue;
        std::unique_ptr<Transfer> transfer = std::move(*it);
        running.erase(it);
        Finish(std::move(transfer), result);
      }
      curl_multi_poll(multi_, nullptr, 0, 100, nullptr);
    }
  }

  ClientOptions options_;
  CURLM* multi_ = nullptr;
  std::thread loop_;
  std::mutex mu_;
  std::deque<std::unique_ptr<Transfer>> incoming_;  // guarded by mu_
  bool cancel_ = false;                             // guarded by mu_
  bool stop_ = false;                               // guarded by mu_
  std::atomic<bool> saw_token_ids_{false};
  std::atomic<bool> saw_usage_{false};
};

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> CreateHttpClient(const ClientOptions& options) {
  if (options.target.rfind("http://", 0) != 0 && options.target.rfind("https://", 0) != 0) {
    return absl::InvalidArgumentError(
        StrCat("--url must start with http:// or https://, got '", options.target, "'"));
  }
  return std::unique_ptr<Client>(new HttpClient(options));
}

absl::StatusOr<std::string> HttpGet(const std::string& url, double timeout_seconds,
                                    const std::string& token) {
  CURL* easy = curl_easy_init();
  if (easy == nullptr) return absl::InternalError("curl_easy_init failed");
  std::string body;
  curl_slist* headers = nullptr;
  if (!token.empty()) {
    headers = curl_slist_append(headers, StrCat("Authorization: Bearer ", token).c_str());
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, headers);
  }
  curl_easy_setopt(easy, CURLOPT_URL, url.c_str());
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &CollectWrite);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_seconds * 1e3));
  const CURLcode result = curl_easy_perform(easy);
  long code = 0;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_cleanup(easy);
  if (headers != nullptr) curl_slist_free_all(headers);
  if (result != CURLE_OK) {
    return absl::UnavailableError(StrCat("GET ", url, ": ", curl_easy_strerror(result)));
  }
  if (code != 200) return absl::UnavailableError(StrCat("GET ", url, ": HTTP ", code));
  return body;
}

}  // namespace lmserve::bench
