// A read-only memory mapping of a whole file (RAII). Weights are read through it in place: loading a
// checkpoint never makes a second full copy of the file in memory.

#ifndef LMSERVE_ENGINE_MODEL_MAPPED_FILE_H_
#define LMSERVE_ENGINE_MODEL_MAPPED_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace lmserve::engine {

class MappedFile {
 public:
  // Maps `path` read-only. Errors name the file.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);

  // Wraps bytes already in memory (tests, fuzzers). The bytes are copied.
  static std::unique_ptr<MappedFile> FromBytes(std::span<const std::byte> bytes, std::string name);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }

  // Drops the pages wholly inside [begin, begin + size) from the process's memory (a loader calls
  // it on a tensor it has copied out, so that the file's pages and the copies are not resident
  // together); reading them again maps them again from the page cache, with the same bytes. Does
  // nothing for FromBytes files and for a range that is not inside this file.
  void DropPages(const std::byte* begin, size_t size) const;

 private:
  MappedFile(std::string path, const std::byte* data, size_t size, bool mapped)
      : path_(std::move(path)), data_(data), size_(size), mapped_(mapped) {}

  std::string path_;
  const std::byte* data_;
  size_t size_;
  bool mapped_;  // true: munmap at destruction; false: delete[] (FromBytes)
};

}  // namespace lmserve::engine

#endif  // LMSERVE_ENGINE_MODEL_MAPPED_FILE_H_
