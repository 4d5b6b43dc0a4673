// The subcommands of the `lmserve` binary. Each takes the arguments after its name and returns the
// process exit code (0 success, 1 runtime error, 2 usage error).

#ifndef LMSERVE_SERVER_CLI_H_
#define LMSERVE_SERVER_CLI_H_

#include <string_view>

namespace lmserve::server {

struct Subcommand {
  std::string_view name;
  std::string_view summary;
  int (*run)(int argc, char** argv);
};

// Model inspection (cmd_info.cc).
int RunInfo(int argc, char** argv);
// Teacher-forced logits of token ids, to a safetensors file (cmd_logits.cc).
int RunLogits(int argc, char** argv);
// Greedy decoding of token ids (cmd_generate.cc).
int RunGenerate(int argc, char** argv);
// GGUF export (cmd_export_gguf.cc).
int RunExportGguf(int argc, char** argv);
// The gRPC server (cmd_serve.cc).
int RunServe(int argc, char** argv);
// Chat template rendering (cmd_chat_template.cc).
int RunChatTemplate(int argc, char** argv);

// Text <-> token ids (cmd_tokenize.cc).
int RunTokenize(int argc, char** argv);
int RunDetokenize(int argc, char** argv);

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_CLI_H_
