#include "server/command_line.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <utility>

namespace lmserve::server {
namespace {

// Runs `parse` (a CLI11 parse of `app`) and reports --help and usage errors (see the header).
template <typename ParseFunction>
std::optional<int> Parse(CLI::App* app, ParseFunction&& parse) {
  try {
    parse();
  } catch (const CLI::CallForHelp&) {
    std::fputs(app->help().c_str(), stdout);  // the selected subcommand's help
    return 0;
  } catch (const CLI::ParseError& error) {
    std::fprintf(stderr, "%s: %s (see --help)\n", CommandName(*app).c_str(), error.what());
    return 2;
  } catch (const std::exception& error) {  // a conversion inside CLI11 that throws its own
    std::fprintf(stderr, "%s: bad command line: %s (see --help)\n", CommandName(*app).c_str(),
                 error.what());
    return 2;
  }
  return std::nullopt;
}

}  // namespace

void UseCommandLineConventions(CLI::App* app) {
  // Subcommands copy these when they are added.
  app->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app->get_formatter()->column_width(40);
}

std::optional<int> ParseCommandLine(CLI::App* app, int argc, char** argv) {
  return Parse(app, [&] { app->parse(argc, argv); });
}

std::optional<int> ParseCommandLine(CLI::App* app, std::vector<std::string> args) {
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  return Parse(app, [&] { app->parse(args); });
}

int RunSubcommands(CLI::App* app, const std::vector<Subcommand>& subcommands, int argc,
                   char** argv) {
  UseCommandLineConventions(app);
  std::vector<std::pair<CLI::App*, CommandRunner>> commands;
  for (const Subcommand& subcommand : subcommands) {
    CLI::App* command = app->add_subcommand(subcommand.name, subcommand.summary);
    commands.emplace_back(command, subcommand.declare(command));
  }
  app->require_subcommand(1);
  const std::string_view first = argc >= 2 ? argv[1] : "";
  if (first.empty() || first == "help") {
    std::fputs(app->help().c_str(), first.empty() ? stderr : stdout);
    return first.empty() ? 2 : 0;
  }
  const bool known = std::any_of(subcommands.begin(), subcommands.end(),
                                 [&](const Subcommand& s) { return s.name == first; });
  if (first.front() != '-' && !known) {
    std::fprintf(stderr, "%s: unknown command '%s'\n\n%s", app->get_name().c_str(), argv[1],
                 app->help().c_str());
    return 2;
  }
  if (std::optional<int> exit_code = ParseCommandLine(app, argc, argv)) return *exit_code;
  for (auto& [command, run] : commands) {
    if (command->parsed()) return run();
  }
  return 2;  // unreachable: a subcommand is required
}

std::string CommandName(const CLI::App& app) {
  std::string name = app.get_name();
  for (const CLI::App* command = &app;;) {
    const std::vector<CLI::App*> selected = command->get_subcommands();
    if (selected.empty()) break;
    command = selected.front();
    name += StrCat(" ", command->get_name());
  }
  return name;
}

int64_t ParseIntFlag(const std::string& flag, const std::string& text, int64_t low, int64_t high) {
  const std::optional<int64_t> value = ParseInt<int64_t>(text);
  if (!value.has_value()) throw CLI::ValidationError(flag, StrCat("not an integer: '", text, "'"));
  if (*value < low || *value > high) {
    throw CLI::ValidationError(flag, StrCat(*value, " is not in [", low, ", ", high, "]"));
  }
  return *value;
}

double ParseDoubleFlag(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) {
    throw CLI::ValidationError(flag, StrCat("not a number: '", text, "'"));
  }
  return value;
}

std::vector<int32_t> ParseIdListFlag(const std::string& flag, const std::string& text) {
  std::vector<int32_t> ids;
  if (text.empty()) return ids;
  for (std::string_view part : StrSplit(text, ',')) {
    const std::optional<int32_t> id = ParseInt<int32_t>(part);
    if (!id.has_value()) {
      throw CLI::ValidationError(flag,
                                 StrCat("not a comma-separated list of integers: '", text, "'"));
    }
    ids.push_back(*id);
  }
  return ids;
}

CLI::Option* AddDoubleFlag(CLI::App* app, const std::string& name, double* value, std::string help,
                           std::function<std::string(double)> check) {
  return app
      ->add_option_function<std::string>(
          name,
          [name, value, check = std::move(check)](const std::string& text) {
            const double parsed = ParseDoubleFlag(name, text);
            if (check) {
              if (std::string wrong = check(parsed); !wrong.empty()) {
                throw CLI::ValidationError(name, StrCat(text, " ", wrong));
              }
            }
            *value = parsed;
          },
          std::move(help))
      ->type_name("NUMBER")
      ->default_str(StrCat(*value));
}

CLI::Option* AddDoubleFlag(CLI::App* app, const std::string& name, std::optional<double>* value,
                           std::string help) {
  return app
      ->add_option_function<std::string>(
          name, [name, value](const std::string& text) { *value = ParseDoubleFlag(name, text); },
          std::move(help))
      ->type_name("NUMBER");
}

CLI::Option* AddStringFlag(CLI::App* app, const std::string& name, std::string* value,
                           std::string help) {
  return app->add_option(name, *value, std::move(help))->type_name("TEXT")->capture_default_str();
}

CLI::Option* AddStringFlag(CLI::App* app, const std::string& name,
                           std::optional<std::string>* value, std::string help) {
  return app
      ->add_option_function<std::string>(
          name, [value](const std::string& text) { *value = text; }, std::move(help))
      ->type_name("TEXT");
}

CLI::Option* AddBoolFlag(CLI::App* app, const std::string& name, bool* value, std::string help) {
  return app->add_flag(name, *value, std::move(help));
}

CLI::Option* AddNegatedFlag(CLI::App* app, const std::string& name, bool* value, std::string help) {
  // Called with the last value given (true for a bare --name); a value that is not a boolean is a
  // ConversionError naming the flag.
  return app->add_flag_callback(
      name, [value] { *value = false; }, std::move(help));
}

CLI::Option* AddIdListFlag(CLI::App* app, const std::string& name, std::vector<int32_t>* value,
                           std::string help) {
  return app
      ->add_option_function<std::string>(
          name, [name, value](const std::string& text) { *value = ParseIdListFlag(name, text); },
          std::move(help))
      ->type_name("ID,ID,...");
}

std::string_view BackendFlagName(const BackendFlag& backend) {
  return backend.has_value() ? engine::BackendName(*backend) : "auto";
}

CLI::Option* AddBackendFlag(CLI::App* app, BackendFlag* backend, std::string help) {
  constexpr std::string_view kChoices = "auto, cpu, cuda";
  return app
      ->add_option_function<std::string>(
          "--backend",
          [backend, kChoices](const std::string& text) {
            if (text == "auto") {
              backend->reset();
              return;
            }
            const std::optional<engine::Backend> parsed = engine::BackendFromName(text);
            if (!parsed.has_value()) {
              throw CLI::ValidationError("--backend",
                                         StrCat("'", text, "' is not one of ", kChoices));
            }
            *backend = *parsed;
          },
          std::move(help))
      ->type_name(StrCat("{", kChoices, "}"))
      ->default_str(std::string(BackendFlagName(*backend)));
}

CLI::Option* AddDtypeFlag(CLI::App* app, engine::RunnerDType* dtype, std::string help) {
  return AddChoiceFlag<engine::RunnerDType>(app, "--dtype", dtype, engine::RunnerDTypeFromName,
                                            "auto, bfloat16, float32, native",
                                            engine::RunnerDTypeName(*dtype), std::move(help));
}

CLI::Option* AddThreadsFlag(CLI::App* app, int32_t* threads) {
  return AddIntFlag(app, "--threads", threads,
                    "CPU threads for matrix products and attention; 0: one per physical core", 0,
                    1024);
}

absl::Status CheckBackendAndDtype(const BackendFlag& backend, engine::RunnerDType dtype) {
  if (backend == engine::Backend::kCpu && dtype == engine::RunnerDType::kBFloat16) {
    return absl::InvalidArgumentError(
        "--dtype bfloat16: the CPU backend keeps the checkpoint's types (auto, native) or converts "
        "to float32 (float32); bfloat16 needs --backend cuda");
  }
  if (backend == engine::Backend::kCuda && dtype == engine::RunnerDType::kNative) {
    return absl::InvalidArgumentError(
        "--dtype native: only the CPU backend keeps the checkpoint's types (use auto, bfloat16 or "
        "float32 with --backend cuda)");
  }
  return absl::OkStatus();
}

engine::Backend ResolveBackend(const BackendFlag& backend, std::string* reason) {
  if (backend.has_value()) return *backend;
  engine::BackendChoice choice = engine::ChooseAutoBackend();
  if (reason != nullptr) *reason = std::move(choice.reason);
  return choice.backend;
}

}  // namespace lmserve::server
