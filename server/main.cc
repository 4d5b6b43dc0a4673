// bin/lmserve: one binary, several subcommands (cli.h), parsed by CLI11 (command_line.h).

#include <cstdio>
#include <string_view>
#include <utility>
#include <vector>

#include "server/cli.h"
#include "server/command_line.h"

namespace {

using lmserve::server::CommandRunner;

struct Subcommand {
  const char* name;
  const char* summary;
  CommandRunner (*declare)(CLI::App* command);
};

constexpr Subcommand kSubcommands[] = {
    {"serve", "serve a model over gRPC, with metrics and health", lmserve::server::DeclareServe},
    {"info", "print a model's configuration and tensors", lmserve::server::DeclareInfo},
    {"logits", "teacher-forced logits of token ids, to a file", lmserve::server::DeclareLogits},
    {"generate", "greedy decoding of token ids", lmserve::server::DeclareGenerate},
    {"export-gguf", "write a model as a GGUF file (f32, f16, q8_0)",
     lmserve::server::DeclareExportGguf},
    {"tokenize", "print the token ids of a text", lmserve::server::DeclareTokenize},
    {"detokenize", "print the text of token ids", lmserve::server::DeclareDetokenize},
    {"chat-template", "render messages with a chat template", lmserve::server::DeclareChatTemplate},
};

bool IsSubcommand(std::string_view name) {
  for (const Subcommand& command : kSubcommands) {
    if (name == command.name) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "lmserve: an LLM server and its tools. `lmserve <command> --help` lists a "
      "command's options.",
      "lmserve");
  lmserve::server::UseCommandLineConventions(&app);
  std::vector<std::pair<CLI::App*, CommandRunner>> commands;
  for (const Subcommand& subcommand : kSubcommands) {
    CLI::App* command = app.add_subcommand(subcommand.name, subcommand.summary);
    commands.emplace_back(command, subcommand.declare(command));
  }
  app.require_subcommand(1);
  // `lmserve` alone is a usage error, `lmserve help` asks for help, and an unknown command is
  // named (CLI11 would only say that a subcommand is required).
  const std::string_view first = argc >= 2 ? argv[1] : "";
  if (first.empty() || first == "help") {
    std::fputs(app.help().c_str(), first.empty() ? stderr : stdout);
    return first.empty() ? 2 : 0;
  }
  if (first.front() != '-' && !IsSubcommand(first)) {
    std::fprintf(stderr, "lmserve: unknown command '%s'\n\n%s", argv[1], app.help().c_str());
    return 2;
  }
  if (std::optional<int> exit_code = lmserve::server::ParseCommandLine(&app, argc, argv)) {
    return *exit_code;
  }
  for (auto& [command, run] : commands) {
    if (command->parsed()) return run();
  }
  return 2;  // unreachable: a subcommand is required
}
