#include "engine/runner/memory_plan.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string_view>

#include "common/file.h"
#include "common/strings.h"

namespace lmserve::engine {
namespace {

// The whole file at root + path with surrounding whitespace trimmed; nullopt when unreadable.
std::optional<std::string> ReadTrimmed(const std::string& root, const std::string& path) {
  absl::StatusOr<std::string> text = ReadFile(root + path);
  if (!text.ok()) return std::nullopt;
  std::string_view view = *text;
  while (!view.empty() && (view.back() == '\n' || view.back() == ' ')) view.remove_suffix(1);
  while (!view.empty() && view.front() == ' ') view.remove_prefix(1);
  return std::string(view);
}

std::optional<int64_t> ReadBytes(const std::string& root, const std::string& path) {
  const std::optional<std::string> text = ReadTrimmed(root, path);
  if (!text.has_value()) return std::nullopt;
  return ParseInt<int64_t>(*text);
}

// MemAvailable from meminfo, in bytes.
std::optional<int64_t> MemAvailable(const std::string& root) {
  absl::StatusOr<std::string> meminfo = ReadFile(root + "/proc/meminfo");
  if (!meminfo.ok()) return std::nullopt;
  for (std::string_view line : StrSplit(*meminfo, '\n')) {
    constexpr std::string_view kKey = "MemAvailable:";
    if (line.substr(0, kKey.size()) != kKey) continue;
    line.remove_prefix(kKey.size());
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    const size_t end = line.find(' ');
    const std::optional<int64_t> kib = ParseInt<int64_t>(line.substr(0, end));
    if (kib.has_value() && *kib >= 0) return *kib * 1024;
  }
  return std::nullopt;
}

// The least room (limit - usage) of this process's cgroup and its ancestors, with the limiting
// one's files named; nullopt when no cgroup limits memory.
std::optional<HostMemory> CgroupRoom(const std::string& root) {
  absl::StatusOr<std::string> cgroups = ReadFile(root + "/proc/self/cgroup");
  if (!cgroups.ok()) return std::nullopt;
  std::optional<HostMemory> best;
  auto consider = [&](int64_t room, std::string source) {
    room = std::max<int64_t>(room, 0);
    if (!best.has_value() || room < best->available_bytes) best = HostMemory{room, source};
  };
  for (std::string_view line : StrSplit(*cgroups, '\n')) {
    // "0::/path" (v2) or "N:controllers:/path" (v1).
    const size_t first = line.find(':');
    const size_t second = first == std::string_view::npos ? first : line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    const std::string_view controllers = line.substr(first + 1, second - first - 1);
    std::string path(line.substr(second + 1));
    if (controllers.empty()) {  // v2: every level from the process's cgroup up to the root
      while (true) {
        const std::string dir = StrCat("/sys/fs/cgroup", path == "/" ? "" : path);
        const std::optional<std::string> max = ReadTrimmed(root, dir + "/memory.max");
        const std::optional<int64_t> current = ReadBytes(root, dir + "/memory.current");
        if (max.has_value() && *max != "max" && current.has_value()) {
          if (const std::optional<int64_t> limit = ParseInt<int64_t>(*max); limit.has_value()) {
            consider(*limit - *current,
                     StrCat("the cgroup's limit, ", dir, "/memory.max ", FormatBytes(*limit),
                            " minus memory.current ", FormatBytes(*current)));
          }
        }
        if (path.empty() || path == "/") break;
        const size_t slash = path.rfind('/');
        path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
      }
    } else if (("," + std::string(controllers) + ",").find(",memory,") != std::string::npos) {
      for (const std::string& dir : {StrCat("/sys/fs/cgroup/memory", path == "/" ? "" : path),
                                     std::string("/sys/fs/cgroup/memory")}) {
        const std::optional<int64_t> limit = ReadBytes(root, dir + "/memory.limit_in_bytes");
        const std::optional<int64_t> usage = ReadBytes(root, dir + "/memory.usage_in_bytes");
        // v1 writes a huge number (page-rounded LONG_MAX) for "no limit".
        if (limit.has_value() && usage.has_value() && *limit < (int64_t{1} << 60)) {
          consider(*limit - *usage, StrCat("the cgroup's limit, ", dir, "/memory.limit_in_bytes ",
                                           FormatBytes(*limit), " minus memory.usage_in_bytes ",
                                           FormatBytes(*usage)));
          break;
        }
      }
    }
  }
  return best;
}

}  // namespace

std::string FormatBytes(int64_t bytes) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  if (bytes < 0) return StrCat("-", FormatBytes(-bytes));
  if (bytes < (int64_t{1} << 40)) return StrCat(bytes / kMiB, " MiB");
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f TiB", static_cast<double>(bytes) / (kMiB * kMiB));
  return text;
}

HostMemory AvailableHostMemory(const std::string& root) {
  HostMemory memory;
  if (const std::optional<int64_t> available = MemAvailable(root); available.has_value()) {
    memory = {*available, "MemAvailable in /proc/meminfo"};
  }
  if (std::optional<HostMemory> cgroup = CgroupRoom(root);
      cgroup.has_value() &&
      (memory.available_bytes < 0 || cgroup->available_bytes < memory.available_bytes)) {
    memory = *std::move(cgroup);
  }
  return memory;
}

int64_t WeightPlanBytes(const WeightPlan& plan, int64_t element_bytes) {
  int64_t elements = 0;
  for (const WeightSpec& spec : plan.specs()) {
    if (!spec.tied_to.present()) elements += spec.num_elements();
  }
  return elements * element_bytes;
}

absl::Status CheckMemoryPlan(const MemoryPlan& plan, std::string_view advice) {
  if (plan.available_bytes < 0 || plan.needed_bytes() <= plan.available_bytes) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(
      StrCat("the model does not fit in ", plan.device, ": weights ",
             FormatBytes(plan.weight_bytes), " + workspaces ", FormatBytes(plan.workspace_bytes),
             " + KV cache ", FormatBytes(plan.kv_cache_bytes),
             plan.state_bytes > 0 ? StrCat(" + state slots ", FormatBytes(plan.state_bytes)) : "",
             " = ",
             FormatBytes(plan.needed_bytes()), ", but only ", FormatBytes(plan.available_bytes),
             " are available (", plan.available_source, ")", advice.empty() ? "" : "; ", advice));
}

}  // namespace lmserve::engine
