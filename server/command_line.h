// Command lines, the one way: CLI11 (Debian's libcli11-dev) for bin/lmserve, bin/lmserve-cli and
// bin/lmserve-bench, with the conventions they share and the flags more than one command takes.
//
// Conventions (what every command line here accepts):
// - `--name value`, `--name=value`, and boolean `--flag` (`--flag=true|false` too);
// - an option given twice keeps the last value;
// - integers are base 10 and checked against a range; numbers are read by strtod ("inf" included);
// - `--help` (or -h) prints the options with their defaults and exits 0; a usage error prints
//   "<program> <command>: <message naming the option>" and exits 2.
//
// The Add*Flag helpers bind a flag to a typed field: the field's value when the flag is absent is
// its default (shown by --help), and a bad value is a CLI11 error that names the flag.

#ifndef LMSERVE_SERVER_COMMAND_LINE_H_
#define LMSERVE_SERVER_COMMAND_LINE_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "common/strings.h"
#include "engine/runner/model_runner.h"

namespace lmserve::server {

// Runs a parsed command: returns the process exit code (0 success, 1 runtime error, 2 usage
// error).
using CommandRunner = std::function<int()>;

// Applies the conventions above to `app` and to the subcommands added to it afterwards.
void UseCommandLineConventions(CLI::App* app);

// Parses argv[1..argc) (argv[0] is the program). Returns the exit code to stop with: 0 after
// printing --help, 2 after printing a usage error; nullopt when the command line is good.
std::optional<int> ParseCommandLine(CLI::App* app, int argc, char** argv);
// The same for `args` (no program name): for tests and for programs that take arguments in parts.
std::optional<int> ParseCommandLine(CLI::App* app, std::vector<std::string> args);

// A subcommand of a program (lmserve, lmserve-cli, lmserve-bench): its name, a line of help, and
// the function that declares its options on it and returns its runner.
struct Subcommand {
  std::string name;
  std::string summary;
  std::function<CommandRunner(CLI::App* command)> declare;
};

// The main() of a program of subcommands: declares each on `app` (whose conventions are set
// here), parses argv and runs the chosen one. Returns the exit code: the command's, or 2 without a
// command (printing the help to stderr), 0 for `PROGRAM help` (printing it to stdout), 2 for an
// unknown command (naming it; CLI11 would only say that a subcommand is required) or a usage
// error.
int RunSubcommands(CLI::App* app, const std::vector<Subcommand>& subcommands, int argc,
                   char** argv);

// "lmserve serve": the app's name and those of the subcommands the command line selected.
std::string CommandName(const CLI::App& app);

// ---- Typed flags
// ---------------------------------------------------------------------------------

// Parses the whole of `text` as a base-10 integer in [low, high]; the error names `flag`.
// (CLI11's own integer conversion is strtoll's base 0: "010" would be 8 and "0x10" 16.)
int64_t ParseIntFlag(const std::string& flag, const std::string& text, int64_t low, int64_t high);
// Parses `text` with strtod ("inf" and "nan" included); the error names `flag`.
double ParseDoubleFlag(const std::string& flag, const std::string& text);
// Parses "1,2,3" (an empty text is an empty list); the error names `flag`.
std::vector<int32_t> ParseIdListFlag(const std::string& flag, const std::string& text);

// `--name INT`, base 10, in [low, high]. T is an integer type or std::optional of one (the
// optional stays empty when the flag is absent).
template <typename T>
requires std::is_integral_v<T> CLI::Option* AddIntFlag(
    CLI::App* app, const std::string& name, T* value, std::string help,
    int64_t low = std::numeric_limits<int64_t>::min(),
    int64_t high = std::numeric_limits<int64_t>::max()) {
  return app
      ->add_option_function<std::string>(
          name,
          [name, value, low, high](const std::string& text) {
            *value = static_cast<T>(ParseIntFlag(name, text, low, high));
          },
          std::move(help))
      ->type_name("INT")
      ->default_str(StrCat(*value));
}
template <typename T>
CLI::Option* AddIntFlag(CLI::App* app, const std::string& name, std::optional<T>* value,
                        std::string help, int64_t low = std::numeric_limits<int64_t>::min(),
                        int64_t high = std::numeric_limits<int64_t>::max()) {
  return app
      ->add_option_function<std::string>(
          name,
          [name, value, low, high](const std::string& text) {
            *value = static_cast<T>(ParseIntFlag(name, text, low, high));
          },
          std::move(help))
      ->type_name("INT");
}

// `--name NUMBER`; `check`, when given, returns "" for a good value or what is wrong with it.
CLI::Option* AddDoubleFlag(CLI::App* app, const std::string& name, double* value, std::string help,
                           std::function<std::string(double)> check = nullptr);
CLI::Option* AddDoubleFlag(CLI::App* app, const std::string& name, std::optional<double>* value,
                           std::string help);

// `--name TEXT`. A std::optional stays empty when the flag is absent (an empty value is a value).
CLI::Option* AddStringFlag(CLI::App* app, const std::string& name, std::string* value,
                           std::string help);
CLI::Option* AddStringFlag(CLI::App* app, const std::string& name,
                           std::optional<std::string>* value, std::string help);

// Boolean `--name`: sets *value to true (`--name=false` to false).
CLI::Option* AddBoolFlag(CLI::App* app, const std::string& name, bool* value, std::string help);
// Boolean `--no-name`: sets *value to false (`--no-name=false` leaves it true).
CLI::Option* AddNegatedFlag(CLI::App* app, const std::string& name, bool* value, std::string help);

// `--name 1,2,3`: comma-separated integers.
CLI::Option* AddIdListFlag(CLI::App* app, const std::string& name, std::vector<int32_t>* value,
                           std::string help);

// `--name CHOICE`, one of the names `parse` knows (`choices` lists them for the error and --help).
template <typename T>
CLI::Option* AddChoiceFlag(CLI::App* app, const std::string& name, T* value,
                           std::function<std::optional<T>(std::string_view)> parse,
                           std::string_view choices, std::string_view default_name,
                           std::string help) {
  return app
      ->add_option_function<std::string>(
          name,
          [name, value, parse, choices = std::string(choices)](const std::string& text) {
            std::optional<T> parsed = parse(text);
            if (!parsed.has_value()) {
              throw CLI::ValidationError(name, StrCat("'", text, "' is not one of ", choices));
            }
            *value = *parsed;
          },
          std::move(help))
      ->type_name(StrCat("{", choices, "}"))
      ->default_str(std::string(default_name));
}

// ---- Flags more than one command takes
// -----------------------------------------------------------

// What --backend says: a backend, or nullopt for auto.
using BackendFlag = std::optional<engine::Backend>;

// "auto", "cpu" or "cuda".
std::string_view BackendFlagName(const BackendFlag& backend);

// --backend auto|cpu|cuda.
CLI::Option* AddBackendFlag(CLI::App* app, BackendFlag* backend, std::string help);
// --dtype auto|bfloat16|float32.
CLI::Option* AddDtypeFlag(CLI::App* app, engine::RunnerDType* dtype, std::string help);
// --threads N (CPU threads for matrix products and attention; 0: one per core).
CLI::Option* AddThreadsFlag(CLI::App* app, int32_t* threads);

// The checks --backend and --dtype need together: the CPU runner computes in float32 only, so an
// explicit --backend cpu with --dtype bfloat16 is refused before anything loads (with auto, the
// runner refuses it once the backend is known).
absl::Status CheckBackendAndDtype(const BackendFlag& backend, engine::RunnerDType dtype);

// The backend --backend names; auto resolves with engine::ChooseAutoBackend, and `*reason` (when
// given) says why.
engine::Backend ResolveBackend(const BackendFlag& backend, std::string* reason = nullptr);

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_COMMAND_LINE_H_
