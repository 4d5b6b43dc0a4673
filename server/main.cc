// bin/lmserve: one binary, several subcommands.

#include <cstdio>
#include <string_view>

#include "server/cli.h"

namespace {

using lmserve::server::Subcommand;

constexpr Subcommand kSubcommands[] = {
    {"serve", "serve a model over gRPC, with metrics and health", lmserve::server::RunServe},
    {"info", "print a model's configuration and tensors", lmserve::server::RunInfo},
    {"logits", "teacher-forced logits of token ids, to a file", lmserve::server::RunLogits},
    {"generate", "greedy decoding of token ids", lmserve::server::RunGenerate},
    {"export-gguf", "write a model as a GGUF file (f32, f16, q8_0)", lmserve::server::RunExportGguf},
    {"tokenize", "print the token ids of a text", lmserve::server::RunTokenize},
    {"detokenize", "print the text of token ids", lmserve::server::RunDetokenize},
    {"chat-template", "render messages with a chat template", lmserve::server::RunChatTemplate},
};

void PrintUsage(FILE* out) {
  std::fputs("usage: lmserve <command> [options]   (lmserve <command> --help for its options)\n\n"
             "commands:\n",
             out);
  for (const Subcommand& command : kSubcommands) {
    std::fprintf(out, "  %-16.*s %.*s\n", static_cast<int>(command.name.size()), command.name.data(),
                 static_cast<int>(command.summary.size()), command.summary.data());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    PrintUsage(stderr);
    return 2;
  }
  const std::string_view name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    PrintUsage(stdout);
    return 0;
  }
  for (const Subcommand& command : kSubcommands) {
    if (command.name == name) return command.run(argc - 2, argv + 2);
  }
  std::fprintf(stderr, "lmserve: unknown command '%.*s'\n\n", static_cast<int>(name.size()),
               name.data());
  PrintUsage(stderr);
  return 2;
}
