// bin/lmserve: one binary, several subcommands (cli.h), parsed by CLI11 (command_line.h).

#include <vector>

#include "server/cli.h"
#include "server/command_line.h"

int main(int argc, char** argv) {
  using lmserve::server::Subcommand;
  namespace server = lmserve::server;
  const std::vector<Subcommand> subcommands = {
      {"serve", "serve a model over gRPC, with metrics and health", server::DeclareServe},
      {"info", "print a model's configuration and tensors", server::DeclareInfo},
      {"logits", "teacher-forced logits of token ids, to a file", server::DeclareLogits},
      {"generate", "greedy decoding of token ids", server::DeclareGenerate},
      {"export-gguf", "write a model as a GGUF file (f32, f16, q8_0, q4_0, q4_k, q6_k)",
       server::DeclareExportGguf},
      {"tokenize", "print the token ids of a text", server::DeclareTokenize},
      {"detokenize", "print the text of token ids", server::DeclareDetokenize},
      {"chat-template", "render messages with a chat template", server::DeclareChatTemplate},
  };
  CLI::App app(
      "lmserve: an LLM server and its tools. `lmserve <command> --help` lists a "
      "command's options.",
      "lmserve");
  return server::RunSubcommands(&app, subcommands, argc, argv);
}
