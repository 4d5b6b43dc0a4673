// Whole-file reads: the one place that turns a path into its bytes, with an error that names it.

#ifndef LMSERVE_COMMON_FILE_H_
#define LMSERVE_COMMON_FILE_H_

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lmserve {

// The bytes of the file at `path`. NotFound when it does not exist, InvalidArgument when it cannot
// be opened or read (a directory, no permission); the message names the path and the reason.
inline absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::error_code ignored;
  if (std::filesystem::is_directory(path, ignored)) {
    return absl::InvalidArgumentError("cannot read " + path + ": it is a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    std::string message = "cannot read " + path + ": " + std::strerror(error);
    if (error == ENOENT) return absl::NotFoundError(message);
    return absl::InvalidArgumentError(message);
  }
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return absl::InvalidArgumentError("cannot read " + path + ": read error");
  return bytes;
}

}  // namespace lmserve

#endif  // LMSERVE_COMMON_FILE_H_
