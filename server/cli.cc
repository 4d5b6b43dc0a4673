#include "server/cli.h"

#include <optional>
#include <string>
#include <vector>

#include "common/strings.h"

namespace lmserve::server {

int RunCommand(std::string_view name, CommandRunner (*declare)(CLI::App* command), int argc,
               char** argv) {
  CLI::App command("", StrCat("lmserve ", name));
  UseCommandLineConventions(&command);
  const CommandRunner run = declare(&command);
  if (std::optional<int> exit_code =
          ParseCommandLine(&command, std::vector<std::string>(argv, argv + argc))) {
    return *exit_code;
  }
  return run();
}

int RunServe(int argc, char** argv) { return RunCommand("serve", DeclareServe, argc, argv); }
int RunInfo(int argc, char** argv) { return RunCommand("info", DeclareInfo, argc, argv); }
int RunLogits(int argc, char** argv) { return RunCommand("logits", DeclareLogits, argc, argv); }
int RunGenerate(int argc, char** argv) {
  return RunCommand("generate", DeclareGenerate, argc, argv);
}
int RunExportGguf(int argc, char** argv) {
  return RunCommand("export-gguf", DeclareExportGguf, argc, argv);
}
int RunTokenize(int argc, char** argv) {
  return RunCommand("tokenize", DeclareTokenize, argc, argv);
}
int RunDetokenize(int argc, char** argv) {
  return RunCommand("detokenize", DeclareDetokenize, argc, argv);
}
int RunChatTemplate(int argc, char** argv) {
  return RunCommand("chat-template", DeclareChatTemplate, argc, argv);
}

}  // namespace lmserve::server
