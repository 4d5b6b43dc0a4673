// A small parser for the options of one `lmserve` subcommand: `--name value`, `--name=value` and
// boolean `--flag`. Each subcommand declares its options with help text; unknown options, missing
// values and missing required options are errors, and `--help` prints the declared options.

#ifndef LMSERVE_SERVER_ARGS_H_
#define LMSERVE_SERVER_ARGS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace lmserve::server {

class Args {
 public:
  Args(std::string command, std::string summary)
      : command_(std::move(command)), summary_(std::move(summary)) {}

  // The program named in the usage line (default "lmserve").
  Args& Program(std::string program) {
    program_ = std::move(program);
    return *this;
  }

  // Declarations. `default_value` empty and `required` false: the option is optional with no value.
  Args& Option(std::string name, std::string help, std::string default_value = "",
               bool required = false);
  Args& Required(std::string name, std::string help) { return Option(name, help, "", true); }
  Args& Flag(std::string name, std::string help);
  // Positional arguments are collected in order (e.g. the prompt of `lmserve-cli complete`).
  Args& Positional(std::string name, std::string help);

  // Parses argv[0..argc) (argv[0] is the subcommand's first argument, not the program name).
  // Returns false and prints help on --help; an error status on bad input.
  absl::StatusOr<bool> Parse(int argc, char** argv);

  std::string Help() const;

  bool Has(std::string_view name) const;
  std::string Get(std::string_view name) const;  // "" when absent and no default
  bool GetFlag(std::string_view name) const;
  absl::StatusOr<int64_t> GetInt(std::string_view name) const;
  absl::StatusOr<double> GetDouble(std::string_view name) const;
  // A comma-separated list of integers ("1,2,3").
  absl::StatusOr<std::vector<int32_t>> GetIntList(std::string_view name) const;
  const std::vector<std::string>& positionals() const { return positional_values_; }

 private:
  struct Spec {
    std::string help;
    std::string default_value;
    bool required = false;
    bool is_flag = false;
  };
  std::string program_ = "lmserve";
  std::string command_;
  std::string summary_;
  std::map<std::string, Spec, std::less<>> specs_;
  std::vector<std::string> order_;
  std::vector<std::pair<std::string, std::string>> positional_specs_;
  std::map<std::string, std::string, std::less<>> values_;
  std::vector<std::string> positional_values_;
};

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_ARGS_H_
