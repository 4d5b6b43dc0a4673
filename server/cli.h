// The subcommands of the `lmserve` binary. Each Declare* function adds its command's flags to
// `command` (a CLI11 subcommand of `lmserve`, see command_line.h), bound to storage the returned
// runner owns, and returns that runner: main() calls the runner of the subcommand the command line
// selected, once it has parsed. Runners return the process exit code (0 success, 1 runtime error,
// 2 usage error). What a command does is its help's footer; the one-line summary that
// `lmserve --help` lists is main.cc's.

#ifndef LMSERVE_SERVER_CLI_H_
#define LMSERVE_SERVER_CLI_H_

#include <string_view>

#include "server/command_line.h"

namespace lmserve::server {

// Model inspection (cmd_info.cc).
CommandRunner DeclareInfo(CLI::App* command);
// Teacher-forced logits of token ids, to a safetensors file (cmd_logits.cc).
CommandRunner DeclareLogits(CLI::App* command);
// Greedy decoding of token ids (cmd_generate.cc).
CommandRunner DeclareGenerate(CLI::App* command);
// GGUF export (cmd_export_gguf.cc).
CommandRunner DeclareExportGguf(CLI::App* command);
// The gRPC server (cmd_serve.cc).
CommandRunner DeclareServe(CLI::App* command);
// Chat template rendering (cmd_chat_template.cc).
CommandRunner DeclareChatTemplate(CLI::App* command);
// Text <-> token ids (cmd_tokenize.cc).
CommandRunner DeclareTokenize(CLI::App* command);
CommandRunner DeclareDetokenize(CLI::App* command);

// One subcommand on its own, as `lmserve <name> <arguments>` runs it: `argv[0, argc)` are the
// arguments after the subcommand's name. Returns the exit code (0 after --help, 2 after a usage
// error). For tests and embedders; bin/lmserve declares every subcommand on one CLI11 app.
int RunCommand(std::string_view name, CommandRunner (*declare)(CLI::App* command), int argc,
               char** argv);
int RunServe(int argc, char** argv);
int RunInfo(int argc, char** argv);
int RunLogits(int argc, char** argv);
int RunGenerate(int argc, char** argv);
int RunExportGguf(int argc, char** argv);
int RunTokenize(int argc, char** argv);
int RunDetokenize(int argc, char** argv);
int RunChatTemplate(int argc, char** argv);

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_CLI_H_
