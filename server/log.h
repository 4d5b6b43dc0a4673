// Server logging: one line per event on stderr, with a UTC timestamp and a level.
//
// Request text (prompts, outputs) is never logged unless the operator turns on --debug-log-text;
// callers check LogText() before logging any.

#ifndef LMSERVE_SERVER_LOG_H_
#define LMSERVE_SERVER_LOG_H_

#include <string_view>

#include "common/strings.h"

namespace lmserve::server {

enum class LogLevel { kInfo, kWarning, kError };

// Writes "2026-01-02T03:04:05.678Z I lmserve: <message>\n" to stderr with one write. Thread-safe.
void Log(LogLevel level, std::string_view message);

template <typename... Args>
void LogInfo(const Args&... args) {
  Log(LogLevel::kInfo, StrCat(args...));
}
template <typename... Args>
void LogWarning(const Args&... args) {
  Log(LogLevel::kWarning, StrCat(args...));
}
template <typename... Args>
void LogError(const Args&... args) {
  Log(LogLevel::kError, StrCat(args...));
}

// Whether request text may be logged (--debug-log-text). Off by default.
bool LogText();
void SetLogText(bool enabled);

}  // namespace lmserve::server

#endif  // LMSERVE_SERVER_LOG_H_
