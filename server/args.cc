#include "server/args.h"

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "common/strings.h"
#include "absl/strings/str_split.h"

namespace lmserve::server {

Args& Args::Option(std::string name, std::string help, std::string default_value, bool required) {
  order_.push_back(name);
  specs_[std::move(name)] = Spec{std::move(help), std::move(default_value), required, false};
  return *this;
}

Args& Args::Flag(std::string name, std::string help) {
  order_.push_back(name);
  specs_[std::move(name)] = Spec{std::move(help), "", false, true};
  return *this;
}

Args& Args::Positional(std::string name, std::string help) {
  positional_specs_.emplace_back(std::move(name), std::move(help));
  return *this;
}

absl::StatusOr<bool> Args::Parse(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(Help().c_str(), stdout);
      return false;
    }
    if (arg.size() < 3 || arg.substr(0, 2) != "--") {
      positional_values_.emplace_back(arg);
      continue;
    }
    std::string_view name = arg.substr(2);
    std::optional<std::string> value;
    if (const size_t eq = name.find('='); eq != std::string_view::npos) {
      value = std::string(name.substr(eq + 1));
      name = name.substr(0, eq);
    }
    auto it = specs_.find(name);
    if (it == specs_.end()) {
      return absl::InvalidArgumentError(
          StrCat(program_, " ", command_, ": unknown option --", name, " (see --help)"));
    }
    if (it->second.is_flag) {
      if (value.has_value() && *value != "true" && *value != "false") {
        return absl::InvalidArgumentError(StrCat("--", name, " takes no value"));
      }
      values_[std::string(name)] = value.value_or("true");
      continue;
    }
    if (!value.has_value()) {
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(StrCat("--", name, " needs a value"));
      }
      value = argv[++i];
    }
    values_[std::string(name)] = *value;
  }
  for (const auto& [name, spec] : specs_) {
    if (spec.required && !values_.contains(name)) {
      return absl::InvalidArgumentError(
          StrCat(program_, " ", command_, ": --", name, " is required (see --help)"));
    }
  }
  return true;
}

std::string Args::Help() const {
  std::string out = StrCat("usage: ", program_, " ", command_, " [options]");
  for (const auto& [name, help] : positional_specs_) out += StrCat(" ", name);
  out += StrCat("\n\n", summary_, "\n\noptions:\n");
  for (const auto& [name, help] : positional_specs_) {
    out += StrCat("  ", name, "\n      ", help, "\n");
  }
  for (const std::string& name : order_) {
    const Spec& spec = specs_.find(name)->second;
    out += StrCat("  --", name, spec.is_flag ? "" : " VALUE", "\n      ", spec.help);
    if (spec.required) out += StrCat(" (required)");
    if (!spec.default_value.empty()) out += StrCat(" (default: ", spec.default_value, ")");
    out += StrCat("\n");
  }
  return out;
}

bool Args::Has(std::string_view name) const { return values_.contains(name); }

std::string Args::Get(std::string_view name) const {
  if (auto it = values_.find(name); it != values_.end()) return it->second;
  if (auto it = specs_.find(name); it != specs_.end()) return it->second.default_value;
  return "";
}

bool Args::GetFlag(std::string_view name) const { return Get(name) == "true"; }

absl::StatusOr<int64_t> Args::GetInt(std::string_view name) const {
  const std::optional<int64_t> value = ParseInt<int64_t>(Get(name));
  if (!value.has_value()) {
    return absl::InvalidArgumentError(StrCat("--", name, ": not an integer: '", Get(name), "'"));
  }
  return *value;
}

absl::StatusOr<double> Args::GetDouble(std::string_view name) const {
  const std::string text = Get(name);
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size()) {
    return absl::InvalidArgumentError(StrCat("--", name, ": not a number: '", Get(name), "'"));
  }
  return value;
}

absl::StatusOr<std::vector<int32_t>> Args::GetIntList(std::string_view name) const {
  std::vector<int32_t> out;
  const std::string text = Get(name);
  if (text.empty()) return out;
  for (std::string_view part : StrSplit(text, ',')) {
    const std::optional<int32_t> value = ParseInt<int32_t>(part);
    if (!value.has_value()) {
      return absl::InvalidArgumentError(
          StrCat("--", name, ": not a comma-separated list of integers: '", text, "'"));
    }
    out.push_back(*value);
  }
  return out;
}

}  // namespace lmserve::server
