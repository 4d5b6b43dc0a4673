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

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include "common/strings.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "lmserve/v1/lmserve.grpc.pb.h"
#include "server/args.h"

namespace lmserve::server {
namespace {

namespace v1 = ::lmserve::v1;
namespace health = ::grpc::health::v1;

constexpr std::string_view kDefaultAddress = "127.0.0.1:50051";

void AddConnectionOptions(Args* args) {
  args->Option("addr", "the server, HOST:PORT (default: $LMSERVE_ADDR, else 127.0.0.1:50051)")
      .Option("token-file", "send 'authorization: Bearer <token>', the token read from this file")
      .Option("token", "the bearer token inline (default: $LMSERVE_TOKEN)")
      .Option("tls-ca", "connect with TLS, trusting this PEM CA (default: plaintext)")
      .Option("tls-cert", "a PEM client certificate (with --tls-key), for servers that want one")
      .Option("tls-key", "the PEM private key of --tls-cert")
      .Option("tls-server-name", "the name to expect in the server's certificate")
      .Option("timeout-s", "the call's deadline in seconds; 0: none", "0")
      .Flag("json", "print responses as JSON");
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    std::fprintf(stderr, "lmserve-cli: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  std::stringstream contents;
  contents << file.rdbuf();
  return contents.str();
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

Connection Connect(const Args& args) {
  Connection connection;
  std::string address = args.Get("addr");
  if (address.empty()) {
    const char* env = std::getenv("LMSERVE_ADDR");
    address = env != nullptr && *env != '\0' ? env : std::string(kDefaultAddress);
  }
  if (args.Has("token-file")) {
    connection.token = ReadFileOrDie(args.Get("token-file"));
    while (!connection.token.empty() &&
           (connection.token.back() == '\n' || connection.token.back() == '\r')) {
      connection.token.pop_back();
    }
  } else if (args.Has("token")) {
    connection.token = args.Get("token");
  } else if (const char* env = std::getenv("LMSERVE_TOKEN"); env != nullptr) {
    connection.token = env;
  }
  absl::StatusOr<double> timeout = args.GetDouble("timeout-s");
  if (!timeout.ok() || *timeout < 0) {
    std::fprintf(stderr, "lmserve-cli: --timeout-s: want seconds >= 0\n");
    std::exit(2);
  }
  connection.timeout_seconds = *timeout;
  connection.json = args.GetFlag("json");
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  grpc::ChannelArguments channel_args;
  channel_args.SetMaxReceiveMessageSize(-1);
  if (args.Has("tls-ca") || args.Has("tls-cert")) {
    grpc::SslCredentialsOptions options;
    if (args.Has("tls-ca")) options.pem_root_certs = ReadFileOrDie(args.Get("tls-ca"));
    if (args.Has("tls-cert")) {
      options.pem_cert_chain = ReadFileOrDie(args.Get("tls-cert"));
      options.pem_private_key = ReadFileOrDie(args.Get("tls-key"));
    }
    credentials = grpc::SslCredentials(options);
    if (args.Has("tls-server-name")) {
      channel_args.SetSslTargetNameOverride(args.Get("tls-server-name"));
    }
  } else {
    credentials = grpc::InsecureChannelCredentials();
  }
  connection.channel = grpc::CreateCustomChannel(address, credentials, channel_args);
  return connection;
}

int Fail(const grpc::Status& status) {
  static constexpr std::string_view kNames[] = {
      "OK",       "CANCELLED",         "UNKNOWN",           "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",   "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",     "UNAVAILABLE",       "DATA_LOSS",
      "UNAUTHENTICATED"};
  const int code = static_cast<int>(status.error_code());
  const std::string_view name = code >= 0 && code <= 16 ? kNames[code] : "UNKNOWN";
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

// Parses a usage error message and exits 2, or returns whether to go on (false after --help).
bool ParseOrExit(Args* args, int argc, char** argv) {
  absl::StatusOr<bool> parsed = args->Parse(argc, argv);
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", std::string(parsed.status().message()).c_str());
    std::exit(2);
  }
  return *parsed;
}

void AddSamplingOptions(Args* args) {
  args->Option("max-tokens", "the most tokens to generate", "64")
      .Option("temperature", "0: greedy (default: the server's, 1)")
      .Option("top-p", "nucleus sampling, in (0, 1]")
      .Option("top-k", "keep the k most likely tokens; 0: all")
      .Option("seed", "the request's random seed")
      .Option("stop", "a stop string")
      .Option("n", "the number of choices", "1")
      .Option("logprobs", "the top N log-probabilities of each generated token")
      .Flag("ignore-eos", "keep generating past end-of-sequence tokens")
      .Option("request-id", "a request id for the server's logs")
      .Flag("no-stream", "one response at the end instead of a stream");
}

bool FillSampling(const Args& args, v1::SamplingParams* sampling) {
  auto int_option = [&](std::string_view name, auto setter) {
    if (!args.Has(name)) return true;
    absl::StatusOr<int64_t> value = args.GetInt(name);
    if (!value.ok()) {
      std::fprintf(stderr, "lmserve-cli: %s\n", std::string(value.status().message()).c_str());
      return false;
    }
    setter(*value);
    return true;
  };
  auto double_option = [&](std::string_view name, auto setter) {
    if (!args.Has(name)) return true;
    absl::StatusOr<double> value = args.GetDouble(name);
    if (!value.ok()) {
      std::fprintf(stderr, "lmserve-cli: %s\n", std::string(value.status().message()).c_str());
      return false;
    }
    setter(*value);
    return true;
  };
  absl::StatusOr<int64_t> max_tokens = args.GetInt("max-tokens");
  if (!max_tokens.ok()) {
    std::fprintf(stderr, "lmserve-cli: %s\n", std::string(max_tokens.status().message()).c_str());
    return false;
  }
  sampling->set_max_tokens(static_cast<int32_t>(*max_tokens));
  absl::StatusOr<int64_t> n = args.GetInt("n");
  if (!n.ok()) return false;
  sampling->set_n(static_cast<int32_t>(*n));
  if (args.Has("stop")) sampling->add_stop(args.Get("stop"));
  sampling->set_ignore_eos(args.GetFlag("ignore-eos"));
  return double_option("temperature", [&](double v) { sampling->set_temperature(v); }) &&
         double_option("top-p", [&](double v) { sampling->set_top_p(v); }) &&
         int_option("top-k", [&](int64_t v) { sampling->set_top_k(static_cast<int32_t>(v)); }) &&
         int_option("seed", [&](int64_t v) { sampling->set_seed(static_cast<uint64_t>(v)); }) &&
         int_option("logprobs",
                    [&](int64_t v) { sampling->set_logprobs(static_cast<int32_t>(v)); });
}

std::string FinishName(v1::FinishReason reason) {
  switch (reason) {
    case v1::FINISH_REASON_STOP: return "stop";
    case v1::FINISH_REASON_LENGTH: return "length";
    case v1::FINISH_REASON_ABORT: return "abort";
    case v1::FINISH_REASON_ERROR: return "error";
    default: return "unspecified";
  }
}

void PrintSummary(const std::vector<v1::FinishReason>& reasons, const v1::Usage& usage,
                  const v1::Timings& timings) {
  std::vector<std::string> names;
  for (v1::FinishReason reason : reasons) names.push_back(FinishName(reason));
  std::fprintf(stderr, "[finish: %s; %d prompt + %d completion tokens; TTFT %.3f s, total %.3f s]\n",
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

int RunComplete(int argc, char** argv) {
  Args args("complete",
            "Completes a prompt, printing the text as it streams in (a summary goes to stderr).");
  args.Program("lmserve-cli").Positional("PROMPT", "the prompt text");
  AddConnectionOptions(&args);
  AddSamplingOptions(&args);
  args.Option("ids", "the prompt as token ids instead of text: 1,2,3 (their ids are printed)")
      .Flag("echo", "print the prompt before the completion")
      .Flag("show-ids", "print the token ids of each piece");
  if (!ParseOrExit(&args, argc, argv)) return 0;
  v1::CompleteRequest request;
  if (args.Has("ids")) {
    absl::StatusOr<std::vector<int32_t>> ids = args.GetIntList("ids");
    if (!ids.ok() || !args.positionals().empty()) {
      std::fprintf(stderr, "lmserve-cli complete: give either PROMPT or --ids 1,2,3\n");
      return 2;
    }
    request.mutable_token_ids()->mutable_ids()->Add(ids->begin(), ids->end());
  } else if (args.positionals().size() == 1) {
    request.set_text(args.positionals()[0]);
  } else {
    std::fprintf(stderr, "lmserve-cli complete: give one PROMPT (quoted) or --ids (see --help)\n");
    return 2;
  }
  if (!FillSampling(args, request.mutable_sampling())) return 2;
  request.set_echo(args.GetFlag("echo"));
  request.set_request_id(args.Get("request-id"));
  const Connection connection = Connect(args);
  const bool show_ids = args.GetFlag("show-ids") || args.Has("ids");
  if (!args.GetFlag("no-stream")) {
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

int RunChat(int argc, char** argv) {
  Args args("chat",
            "An interactive chat: each line on stdin is a user turn; the reply streams back. With "
            "MESSAGE, one turn only. End with EOF (Ctrl-D).");
  args.Program("lmserve-cli").Positional("MESSAGE", "a single user message (optional)");
  AddConnectionOptions(&args);
  AddSamplingOptions(&args);
  args.Option("system", "a system message to start the conversation with");
  if (!ParseOrExit(&args, argc, argv)) return 0;
  v1::ChatRequest request;
  if (!FillSampling(args, request.mutable_sampling())) return 2;
  request.set_request_id(args.Get("request-id"));
  if (args.Has("system")) {
    v1::ChatMessage* system = request.add_messages();
    system->set_role("system");
    system->set_content(args.Get("system"));
  }
  const Connection connection = Connect(args);
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
  if (!args.positionals().empty()) return turn(StrJoin(args.positionals(), " "));
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

int RunHealth(int argc, char** argv) {
  Args args("health",
            "Asks grpc.health.v1.Health. Prints SERVING or NOT_SERVING; exits 0 when SERVING.");
  args.Program("lmserve-cli");
  AddConnectionOptions(&args);
  args.Option("wait", "poll for up to this many seconds until SERVING", "0")
      .Option("service", "the service to ask about (\"\": the server)", "");
  if (!ParseOrExit(&args, argc, argv)) return 0;
  absl::StatusOr<double> wait = args.GetDouble("wait");
  if (!wait.ok() || *wait < 0) {
    std::fprintf(stderr, "lmserve-cli health: --wait: want seconds >= 0\n");
    return 2;
  }
  const Connection connection = Connect(args);
  auto stub = health::Health::NewStub(connection.channel);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(*wait * 1000));
  health::HealthCheckRequest request;
  request.set_service(args.Get("service"));
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
        std::printf("%s\n", health::HealthCheckResponse::ServingStatus_Name(response.status()).c_str());
      }
      return serving ? 0 : 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

template <typename Response, typename Request>
int RunUnary(const Args& args, const Request& request,
             grpc::Status (v1::Lmserve::Stub::*method)(grpc::ClientContext*, const Request&,
                                                       Response*)) {
  const Connection connection = Connect(args);
  auto stub = v1::Lmserve::NewStub(connection.channel);
  grpc::ClientContext context;
  connection.Prepare(&context);
  Response response;
  const grpc::Status status = (stub.get()->*method)(&context, request, &response);
  if (!status.ok()) return Fail(status);
  PrintJson(response);
  return 0;
}

int RunModelInfo(int argc, char** argv) {
  Args args("info", "Prints the served model's information (GetModelInfo) as JSON.");
  args.Program("lmserve-cli");
  AddConnectionOptions(&args);
  if (!ParseOrExit(&args, argc, argv)) return 0;
  return RunUnary<v1::ModelInfo>(args, v1::GetModelInfoRequest(), &v1::Lmserve::Stub::GetModelInfo);
}

int RunStatus(int argc, char** argv) {
  Args args("status", "Prints the server's load (GetServerStatus) as JSON.");
  args.Program("lmserve-cli");
  AddConnectionOptions(&args);
  if (!ParseOrExit(&args, argc, argv)) return 0;
  return RunUnary<v1::ServerStatus>(args, v1::GetServerStatusRequest(),
                                    &v1::Lmserve::Stub::GetServerStatus);
}

int RunTokenize(int argc, char** argv) {
  Args args("tokenize", "Prints the token ids of TEXT as JSON.");
  args.Program("lmserve-cli").Positional("TEXT", "the text");
  AddConnectionOptions(&args);
  args.Flag("no-special-tokens", "do not add BOS and the like");
  if (!ParseOrExit(&args, argc, argv)) return 0;
  if (args.positionals().size() != 1) {
    std::fprintf(stderr, "lmserve-cli tokenize: give one TEXT (quoted)\n");
    return 2;
  }
  v1::TokenizeRequest request;
  request.set_text(args.positionals()[0]);
  request.set_add_special_tokens(!args.GetFlag("no-special-tokens"));
  return RunUnary<v1::TokenizeResponse>(args, request, &v1::Lmserve::Stub::Tokenize);
}

int RunDetokenize(int argc, char** argv) {
  Args args("detokenize", "Prints the text of token ids as JSON.");
  args.Program("lmserve-cli");
  AddConnectionOptions(&args);
  args.Required("ids", "token ids: 1,2,3").Flag("skip-special-tokens", "leave special tokens out");
  if (!ParseOrExit(&args, argc, argv)) return 0;
  absl::StatusOr<std::vector<int32_t>> ids = args.GetIntList("ids");
  if (!ids.ok()) {
    std::fprintf(stderr, "lmserve-cli: %s\n", std::string(ids.status().message()).c_str());
    return 2;
  }
  v1::DetokenizeRequest request;
  request.mutable_token_ids()->Add(ids->begin(), ids->end());
  request.set_skip_special_tokens(args.GetFlag("skip-special-tokens"));
  return RunUnary<v1::DetokenizeResponse>(args, request, &v1::Lmserve::Stub::Detokenize);
}

struct CliCommand {
  std::string_view name;
  std::string_view summary;
  int (*run)(int argc, char** argv);
};

constexpr CliCommand kCommands[] = {
    {"complete", "complete a prompt, streaming the text", RunComplete},
    {"chat", "chat with the model (interactive, or one MESSAGE)", RunChat},
    {"health", "the server's health (exit 0 when SERVING); --wait polls", RunHealth},
    {"info", "the served model's information", RunModelInfo},
    {"status", "the server's load", RunStatus},
    {"tokenize", "the token ids of a text", RunTokenize},
    {"detokenize", "the text of token ids", RunDetokenize},
};

void PrintUsage(FILE* out) {
  std::fputs("usage: lmserve-cli <command> [options]   (lmserve-cli <command> --help)\n\n"
             "commands:\n",
             out);
  for (const CliCommand& command : kCommands) {
    std::fprintf(out, "  %-12.*s %.*s\n", static_cast<int>(command.name.size()),
                 command.name.data(), static_cast<int>(command.summary.size()),
                 command.summary.data());
  }
}

}  // namespace
}  // namespace lmserve::server

int main(int argc, char** argv) {
  using lmserve::server::kCommands;
  if (argc < 2) {
    lmserve::server::PrintUsage(stderr);
    return 2;
  }
  const std::string_view name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    lmserve::server::PrintUsage(stdout);
    return 0;
  }
  for (const auto& command : kCommands) {
    if (command.name == name) return command.run(argc - 2, argv + 2);
  }
  std::fprintf(stderr, "lmserve-cli: unknown command '%s'\n\n", argv[1]);
  lmserve::server::PrintUsage(stderr);
  return 2;
}
