#include "engine/model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "common/strings.h"

namespace lmserve::engine {

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::Status(err == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kUnavailable,
                        StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(StrCat(path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size == 0) {
    ::close(fd);
    return absl::InvalidArgumentError(StrCat(path, ": file is empty"));
  }
  void* data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (data == MAP_FAILED) {
    return absl::UnavailableError(StrCat(path, ": mmap failed: ", std::strerror(err)));
  }
  return std::unique_ptr<MappedFile>(
      new MappedFile(path, static_cast<const std::byte*>(data), size, /*mapped=*/true));
}

std::unique_ptr<MappedFile> MappedFile::FromBytes(std::span<const std::byte> bytes,
                                                  std::string name) {
  auto* copy = new std::byte[bytes.size() == 0 ? 1 : bytes.size()];
  if (!bytes.empty()) std::memcpy(copy, bytes.data(), bytes.size());
  return std::unique_ptr<MappedFile>(
      new MappedFile(std::move(name), copy, bytes.size(), /*mapped=*/false));
}

void MappedFile::DropPages(const std::byte* begin, size_t size) const {
  if (!mapped_ || begin < data_ || size > size_ || begin - data_ > static_cast<ptrdiff_t>(size_ - size)) {
    return;
  }
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + page - 1) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(begin) + size) / page * page;
  if (first >= last) return;
  // A private, read-only file mapping: its pages are the file's, never written, so dropping them
  // loses nothing (a failure leaves them resident, which is harmless).
  ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

MappedFile::~MappedFile() {
  if (mapped_) {
    ::munmap(const_cast<std::byte*>(data_), size_);
  } else {
    delete[] data_;
  }
}

}  // namespace lmserve::engine
