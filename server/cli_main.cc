// bin/lmserve-cli: a command-line client of the lmserve gRPC API.
//
//   lmserve-cli complete "The capital of France is"   streams the completion as it arrives
//   lmserve-cli complete --ids 1,2,3 --max-tokens 8    a token-id prompt
//   lmserve-cli chat                                   an interactive chat (one line per turn)
//   lmserve-cli health --wait 120                      waits until the server says SERVING
//   lmserve-cli info | status | tokenize TEXT | detokenize --ids 1,2,3
//
// --json prints the responses as JSON (one object per line when streaming). The server address,
// TLS and the bearer token are options, or $LMSERVE_ADDR and $LMSERVE_TOKEN.
// Exit codes: 0 success, 1 an RPC failed (its status is printed), 2 bad usage.

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/file.h"
#include "common/strings.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "lmserve/v1/lmserve.grpc.pb.h"
#include "server/command_line.h"
#include "server/grpc_status.h"

namespace lmserve::server {
namespace {

namespace v1 = ::lmserve::v1;
namespace health = ::grpc::health::v1;

constexpr std::string_view kDefaultAddress = "127.0.0.1:50051";

struct ConnectionOptions {
  std::string addr;  // "": $LMSERVE_ADDR, else kDefaultAddress
  std::optional<std::string> token_file;
  std::optional<std::string> token;
  std::optional<std::string> tls_ca;
  std::optional<std::string> tls_cert;
  std::optional<std::string> tls_key;
  std::optional<std::string> tls_server_name;
  double timeout_seconds = 0;
  bool json = false;
};

void BindConnectionFlags(CLI::App* command, ConnectionOptions* options) {
  AddStringFlag(command, "--addr", &options->addr,
                "the server, HOST:PORT (default: $LMSERVE_ADDR, else 127.0.0.1:50051)");
  AddStringFlag(command, "--token-file", &options->token_file,
                "send 'authorization: Bearer <token>', the token read from this file");
  AddStringFlag(command, "--token", &options->token,
                "the bearer token inline (default: $LMSERVE_TOKEN)");
  AddStringFlag(command, "--tls-ca", &options->tls_ca,
                "connect with TLS, trusting this PEM CA (default: plaintext)");
  AddStringFlag(command, "--tls-cert", &options->tls_cert,
                "a PEM client certificate (with --tls-key), for servers that want one");
  AddStringFlag(command, "--tls-key", &options->tls_key, "the PEM private key of --tls-cert");
  AddStringFlag(command, "--tls-server-name", &options->tls_server_name,
                "the name to expect in the server's certificate");
  AddDoubleFlag(command, "--timeout-s", &options->timeout_seconds,
                "the call's deadline in seconds; 0: none",
                [](double seconds) { return seconds >= 0 ? "" : "is not seconds >= 0"; });
  AddBoolFlag(command, "--json", &options->json, "print responses as JSON");
}

// The file of `flag`, or exit 2 saying why it cannot be read.
std::string ReadFileOrDie(std::string_view flag, const std::string& path) {
  absl::StatusOr<std::string> contents = ReadFile(path);
  if (!contents.ok()) {
    std::fprintf(stderr, "lmserve-cli: --%.*s: %s\n", static_cast<int>(flag.size()), flag.data(),
                 std::string(contents.status().message()).c_str());
    std::exit(2);
  }
  return *std::move(contents);
}

struct Connection {
  std::shared_ptr<grpc::Channel> channel;
  std::string token;
  double timeout_seconds = 0;
  bool json = false;

  void Prepare(grpc::ClientContext* context) const {
    if (!token.empty()) context->AddMetadata("authorization", StrCat("Bearer ", token));
    if (timeout_seconds > 0) {
      context->set_deadline(std::chrono::system_clock::now() +
                            std::chrono::microseconds(static_cast<int64_t>(timeout_seconds * 1e6)));
    }
  }
};

Connection Connect(const ConnectionOptions& options) {
  Connection connection;
  std::string address = options.addr;
  if (address.empty()) {
    const char* env = std::getenv("LMSERVE_ADDR");
    address = env != nullptr && *env != '\0' ? env : std::string(kDefaultAddress);
  }
  if (options.token_file.has_value()) {
    connection.token = ReadFileOrDie("token-file", *options.token_file);
    while (!connection.token.empty() &&
           (connection.token.back() == '\n' || connection.token.back() == '\r')) {
      connection.token.pop_back();
    }
  } else if (options.token.has_value()) {
    connection.token = *options.token;
  } else if (const char* env = std::getenv("LMSERVE_TOKEN"); env != nullptr) {
    connection.token = env;
  }
  connection.timeout_seconds = options.timeout_seconds;
  connection.json = options.json;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(-1);
  if (options.tls_ca.has_value() || options.tls_cert.has_value()) {
    grpc::SslCredentialsOptions ssl_options;
    if (options.tls_ca.has_value()) {
      ssl_options.pem_root_certs = ReadFileOrDie("tls-ca", *options.tls_ca);
    }
    if (options.tls_cert.has_value()) {
      ssl_options.pem_cert_chain = ReadFileOrDie("tls-cert", *options.tls_cert);
      ssl_options.pem_private_key = ReadFileOrDie("tls-key", options.tls_key.value_or(""));
    }
    credentials = grpc::SslCredentials(ssl_options);
    if (options.tls_server_name.has_value()) {
      channel_args.SetSslTargetNameOverride(*options.tls_server_name);
    }
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  connection.channel = grpc::CreateCustomChannel(address, credentials, channel_args);
  return connection;
}

int Fail(const grpc::Status& status) {
  const std::string_view name = GrpcCodeName(status.error_code());
  std::fprintf(stderr, "lmserve-cli: %.*s: %s\n", static_cast<int>(name.size()), name.data(),
               status.error_message().c_str());
  return 1;
}

void PrintJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  std::fwrite(json.data(), 1, json.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

struct SamplingOptions {
  int64_t max_tokens = 64;
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<int64_t> seed;
  std::optional<std::string> stop;
  int64_t n = 1;
  std::optional<int64_t> logprobs;
  bool ignore_eos = false;
  std::string request_id;
  bool no_stream = false;
};

void BindSamplingFlags(CLI::App* command, SamplingOptions* options) {
  AddIntFlag(command, "--max-tokens", &options->max_tokens, "the most tokens to generate");
  AddDoubleFlag(command, "--temperature", &options->temperature,
                "0: greedy (default: the server's, 1)");
  AddDoubleFlag(command, "--top-p", &options->top_p, "nucleus sampling, in (0, 1]");
  AddIntFlag(command, "--top-k", &options->top_k, "keep the k most likely tokens; 0: all");
  AddIntFlag(command, "--seed", &options->seed, "the request's random seed");
  AddStringFlag(command, "--stop", &options->stop, "a stop string");
  AddIntFlag(command, "--n", &options->n, "the number of choices");
  AddIntFlag(command, "--logprobs", &options->logprobs,
             "the top N log-probabilities of each generated token");
  AddBoolFlag(command, "--ignore-eos", &options->ignore_eos,
              "keep generating past end-of-sequence tokens");
  AddStringFlag(command, "--request-id", &options->request_id,
                "a request id for the server's logs");
  AddBoolFlag(command, "--no-stream", &options->no_stream,
              "one response at the end instead of a stream");
}

void FillSampling(const SamplingOptions& options, v1::SamplingParams* sampling) {
  sampling->set_max_tokens(static_cast<int32_t>(options.max_tokens));
  sampling->set_n(static_cast<int32_t>(options.n));
  if (options.stop.has_value()) sampling->add_stop(*options.stop);
  sampling->set_ignore_eos(options.ignore_eos);
  if (options.temperature.has_value()) sampling->set_temperature(*options.temperature);
  if (options.top_p.has_value()) sampling->set_top_p(*options.top_p);
  if (options.top_k.has_value()) sampling->set_top_k(static_cast<int32_t>(*options.top_k));
  if (options.seed.has_value()) sampling->set_seed(static_cast<uint64_t>(*options.seed));
  if (options.logprobs.has_value()) {
    sampling->set_logprobs(static_cast<int32_t>(*options.logprobs));
  }
}

// Positional arguments, in order, kept as they come.
CLI::Option* AddPositionals(CLI::App* command, const std::string& name,
                            std::vector<std::string>* values, std::string help) {
  return command->add_option(name, *values, std::move(help))
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

std::string FinishName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_ABORT:
      return "abort";
    case v1::FINISH_REASON_ERROR:
      return "error";
    default:
      return "unspecified";
  }
}

void PrintSummary(const std::vector<v1::FinishReason>& reasons, const v1::Usage& usage,
                  const v1::Timings& timings) {
  std::vector<std::string> names;
  for (v1::FinishReason reason : reasons) names.push_back(FinishName(reason));
  std::fprintf(stderr,
               "[finish: %s; %d prompt + %d completion tokens; TTFT %.3f s, total %.3f s]\n",
               StrJoin(names, ",").c_str(), usage.prompt_tokens(), usage.completion_tokens(),
               timings.time_to_first_token_seconds(), timings.total_seconds());
}

// Runs a CompleteStream or ChatStream and prints it. Returns the exit code; appends choice 0's text
// to `*text` when given.
template <typename Request>
int RunStream(const Connection& connection, const Request& request, bool show_ids,
              std::string* text,
              std::unique_ptr<grpc::ClientReader<v1::CompleteStreamResponse>> (*call)(
                  v1::Lmserve::Stub*, grpc::ClientContext*, const Request&)) {
  auto stub = v1::Lmserve::NewStub(connection.channel);
  grpc::ClientContext context;
  connection.Prepare(&context);
  std::unique_ptr<grpc::ClientReader<v1::CompleteStreamResponse>> reader =
      call(stub.get(), &context, request);
  v1::CompleteStreamResponse message;
  std::vector<v1::FinishReason> reasons;
  v1::Usage usage;
  v1::Timings timings;
  const bool multi = request.sampling().n() > 1;
  while (reader->Read(&message)) {
    if (connection.json) {
      PrintJson(message);
      continue;
    }
    if (message.index() == 0 && text != nullptr) text->append(message.text());
    std::string out = multi && (!message.text().empty() || show_ids)
                          ? StrCat("[", message.index(), "] ", message.text())
                          : message.text();
    if (show_ids && message.token_ids_size() > 0) {
      out += StrCat(out.empty() ? "" : " ", StrJoin(message.token_ids(), " "), multi ? "\n" : " ");
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
    if (message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      reasons.push_back(message.finish_reason());
    }
    if (message.has_usage()) usage = message.usage();
    if (message.has_timings()) timings = message.timings();
  }
  const grpc::Status status = reader->Finish();
  if (!connection.json) {
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
  if (!status.ok()) return Fail(status);
  if (!connection.json) PrintSummary(reasons, usage, timings);
  return 0;
}

struct CompleteOptions {
  ConnectionOptions connection;
  SamplingOptions sampling;
  std::vector<std::string> prompt;
  std::optional<std::vector<int32_t>> ids;
  bool echo = false;
  bool show_ids = false;
};

int RunComplete(const CompleteOptions& options) {
  v1::CompleteRequest request;
  if (options.ids.has_value()) {
    if (!options.prompt.empty()) {
      std::fprintf(stderr, "lmserve-cli complete: give either PROMPT or --ids 1,2,3\n");
      return 2;
    }
    request.mutable_token_ids()->mutable_ids()->Add(options.ids->begin(), options.ids->end());
  } else if (options.prompt.size() == 1) {
    request.set_text(options.prompt[0]);
  } else {
    std::fprintf(stderr, "lmserve-cli complete: give one PROMPT (quoted) or --ids (see --help)\n");
    return 2;
  }
  FillSampling(options.sampling, request.mutable_sampling());
  request.set_echo(options.echo);
  request.set_request_id(options.sampling.request_id);
  const Connection connection = Connect(options.connection);
  const bool show_ids = options.show_ids || options.ids.has_value();
  if (!options.sampling.no_stream) {
    return RunStream<v1::CompleteRequest>(
        connection, request, show_ids, nullptr,
        [](v1::Lmserve::Stub* stub, grpc::ClientContext* context, const v1::CompleteRequest& r) {
          return stub->CompleteStream(context, r);
        });
  }
  auto stub = v1::Lmserve::NewStub(connection.channel);
  grpc::ClientContext context;
  connection.Prepare(&context);
  v1::CompleteResponse response;
  const grpc::Status status = stub->Complete(&context, request, &response);
  if (!status.ok()) return Fail(status);
  if (connection.json) {
    PrintJson(response);
    return 0;
  }
  std::vector<v1::FinishReason> reasons;
  for (const v1::Choice& choice : response.choices()) {
    std::string out = response.choices_size() > 1 ? StrCat("[", choice.index(), "] ") : "";
    out += choice.text();
    if (show_ids) out += StrCat(choice.text().empty() ? "" : " ", StrJoin(choice.token_ids(), " "));
    std::printf("%s\n", out.c_str());
    reasons.push_back(choice.finish_reason());
  }
  PrintSummary(reasons, response.usage(), response.timings());
  return 0;
}

CommandRunner DeclareComplete(CLI::App* command) {
  command->footer(
      "Completes a prompt, printing the text as it streams in (a summary goes to stderr).");
  auto options = std::make_shared<CompleteOptions>();
  AddPositionals(command, "PROMPT", &options->prompt, "the prompt text");
  BindConnectionFlags(command, &options->connection);
  BindSamplingFlags(command, &options->sampling);
  command
      ->add_option_function<std::string>(
          "--ids",
          [options](const std::string& text) { options->ids = ParseIdListFlag("--ids", text); },
          "the prompt as token ids instead of text: 1,2,3 (their ids are printed)")
      ->type_name("ID,ID,...");
  AddBoolFlag(command, "--echo", &options->echo, "print the prompt before the completion");
  AddBoolFlag(command, "--show-ids", &options->show_ids, "print the token ids of each piece");
  return [options] { return RunComplete(*options); };
}

struct ChatOptions {
  ConnectionOptions connection;
  SamplingOptions sampling;
  std::vector<std::string> message;
  std::optional<std::string> system;
  std::optional<std::string> chat_template_kwargs;  // a JSON object
};

int RunChat(const ChatOptions& options) {
  v1::ChatRequest request;
  if (options.chat_template_kwargs.has_value()) {
    const auto parsed = google::protobuf::util::JsonStringToMessage(
        *options.chat_template_kwargs, request.mutable_chat_template_kwargs());
    if (!parsed.ok()) {
      std::fprintf(stderr, "lmserve-cli chat: --chat-template-kwargs: not a JSON object: %s\n",
                   std::string(parsed.message()).c_str());
      return 2;
    }
  }
  FillSampling(options.sampling, request.mutable_sampling());
  request.set_request_id(options.sampling.request_id);
  if (options.system.has_value()) {
    v1::ChatMessage* system = request.add_messages();
    system->set_role("system");
    system->set_content(*options.system);
  }
  const Connection connection = Connect(options.connection);
  auto stream_call = [](v1::Lmserve::Stub* stub, grpc::ClientContext* context,
                        const v1::ChatRequest& r) { return stub->ChatStream(context, r); };
  auto turn = [&](const std::string& user_text) {
    v1::ChatMessage* user = request.add_messages();
    user->set_role("user");
    user->set_content(user_text);
    std::string reply;
    const int code = RunStream<v1::ChatRequest>(connection, request, false, &reply, stream_call);
    if (code == 0) {
      v1::ChatMessage* assistant = request.add_messages();
      assistant->set_role("assistant");
      assistant->set_content(reply);
    } else {
      request.mutable_messages()->RemoveLast();
    }
    return code;
  };
  if (!options.message.empty()) return turn(StrJoin(options.message, " "));
  const bool interactive = isatty(STDIN_FILENO);
  int code = 0;
  std::string line;
  while (true) {
    if (interactive) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    code = turn(line);
  }
  if (interactive) std::fputc('\n', stdout);
  return code;
}

CommandRunner DeclareChat(CLI::App* command) {
  command->footer(
      "An interactive chat: each line on stdin is a user turn; the reply streams back. With "
      "MESSAGE, one turn only. End with EOF (Ctrl-D).");
  auto options = std::make_shared<ChatOptions>();
  AddPositionals(command, "MESSAGE", &options->message, "a single user message (optional)");
  BindConnectionFlags(command, &options->connection);
  BindSamplingFlags(command, &options->sampling);
  AddStringFlag(command, "--system", &options->system,
                "a system message to start the conversation with");
  AddStringFlag(
      command, "--chat-template-kwargs", &options->chat_template_kwargs,
      "more chat template variables, a JSON object (e.g. '{\"enable_thinking\": false}')");
  return [options] { return RunChat(*options); };
}

struct HealthOptions {
  ConnectionOptions connection;
  double wait_seconds = 0;
  std::string service;
};

int RunHealth(const HealthOptions& options) {
  const Connection connection = Connect(options.connection);
  auto stub = health::Health::NewStub(connection.channel);
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(options.wait_seconds * 1000));
  health::HealthCheckRequest request;
  request.set_service(options.service);
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!connection.token.empty()) {
      context.AddMetadata("authorization", StrCat("Bearer ", connection.token));
    }
    health::HealthCheckResponse response;
    const grpc::Status status = stub->Check(&context, request, &response);
    const bool serving = status.ok() && response.status() == health::HealthCheckResponse::SERVING;
    if (serving || std::chrono::steady_clock::now() >= deadline) {
      if (!status.ok()) return Fail(status);
      if (connection.json) {
        PrintJson(response);
      } else {
        std::printf("%s\n",
                    health::HealthCheckResponse::ServingStatus_Name(response.status()).c_str());
      }
      return serving ? 0 : 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

CommandRunner DeclareHealth(CLI::App* command) {
  command->footer(
      "Asks grpc.health.v1.Health. Prints SERVING or NOT_SERVING; exits 0 when SERVING.");
  auto options = std::make_shared<HealthOptions>();
  BindConnectionFlags(command, &options->connection);
  AddDoubleFlag(command, "--wait", &options->wait_seconds,
                "poll for up to this many seconds until SERVING",
                [](double seconds) { return seconds >= 0 ? "" : "is not seconds >= 0"; });
  AddStringFlag(command, "--service", &options->service,
                "the service to ask about (\"\": the server)");
  return [options] { return RunHealth(*options); };
}

template <typename Response, typename Request>
int RunUnary(const ConnectionOptions& options, const Request& request,
             grpc::Status (v1::Lmserve::Stub::*method)(grpc::ClientContext*, const Request&,
                                                       Response*)) {
  const Connection connection = Connect(options);
  auto stub = v1::Lmserve::NewStub(connection.channel);
  grpc::ClientContext context;
  connection.Prepare(&context);
  Response response;
  const grpc::Status status = (stub.get()->*method)(&context, request, &response);
  if (!status.ok()) return Fail(status);
  PrintJson(response);
  return 0;
}

CommandRunner DeclareModelInfo(CLI::App* command) {
  command->footer("Prints the served model's information (GetModelInfo) as JSON.");
  auto options = std::make_shared<ConnectionOptions>();
  BindConnectionFlags(command, options.get());
  return [options] {
    return RunUnary<v1::ModelInfo>(*options, v1::GetModelInfoRequest(),
                                   &v1::Lmserve::Stub::GetModelInfo);
  };
}

CommandRunner DeclareStatus(CLI::App* command) {
  command->footer("Prints the server's load (GetServerStatus) as JSON.");
  auto options = std::make_shared<ConnectionOptions>();
  BindConnectionFlags(command, options.get());
  return [options] {
    return RunUnary<v1::ServerStatus>(*options, v1::GetServerStatusRequest(),
                                      &v1::Lmserve::Stub::GetServerStatus);
  };
}

struct TokenizeOptions {
  ConnectionOptions connection;
  std::vector<std::string> text;
  bool no_special_tokens = false;
};

CommandRunner DeclareTokenize(CLI::App* command) {
  command->footer("Prints the token ids of TEXT as JSON.");
  auto options = std::make_shared<TokenizeOptions>();
  AddPositionals(command, "TEXT", &options->text, "the text");
  BindConnectionFlags(command, &options->connection);
  AddBoolFlag(command, "--no-special-tokens", &options->no_special_tokens,
              "do not add BOS and the like");
  return [options] {
    if (options->text.size() != 1) {
      std::fprintf(stderr, "lmserve-cli tokenize: give one TEXT (quoted)\n");
      return 2;
    }
    v1::TokenizeRequest request;
    request.set_text(options->text[0]);
    request.set_add_special_tokens(!options->no_special_tokens);
    return RunUnary<v1::TokenizeResponse>(options->connection, request,
                                          &v1::Lmserve::Stub::Tokenize);
  };
}

struct DetokenizeOptions {
  ConnectionOptions connection;
  std::vector<int32_t> ids;
  bool skip_special_tokens = false;
};

CommandRunner DeclareDetokenize(CLI::App* command) {
  command->footer("Prints the text of token ids as JSON.");
  auto options = std::make_shared<DetokenizeOptions>();
  BindConnectionFlags(command, &options->connection);
  AddIdListFlag(command, "--ids", &options->ids, "token ids: 1,2,3")->required();
  AddBoolFlag(command, "--skip-special-tokens", &options->skip_special_tokens,
              "leave special tokens out");
  return [options] {
    v1::DetokenizeRequest request;
    request.mutable_token_ids()->Add(options->ids.begin(), options->ids.end());
    request.set_skip_special_tokens(options->skip_special_tokens);
    return RunUnary<v1::DetokenizeResponse>(options->connection, request,
                                            &v1::Lmserve::Stub::Detokenize);
  };
}

}  // namespace
}  // namespace lmserve::server

int main(int argc, char** argv) {
  namespace server = lmserve::server;
  const std::vector<server::Subcommand> subcommands = {
      {"complete", "complete a prompt, streaming the text", server::DeclareComplete},
      {"chat", "chat with the model (interactive, or one MESSAGE)", server::DeclareChat},
      {"health", "the server's health (exit 0 when SERVING); --wait polls", server::DeclareHealth},
      {"info", "the served model's information", server::DeclareModelInfo},
      {"status", "the server's load", server::DeclareStatus},
      {"tokenize", "the token ids of a text", server::DeclareTokenize},
      {"detokenize", "the text of token ids", server::DeclareDetokenize},
  };
  CLI::App app(
      "lmserve-cli: a command-line client of the lmserve gRPC API. "
      "`lmserve-cli <command> --help` lists a command's options.",
      "lmserve-cli");
  return server::RunSubcommands(&app, subcommands, argc, argv);
}
