// fulgur::data::detail::MappedFile (src/data/mapped_file.hpp).
#include "src/data/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "fulgur/errors.hpp"

namespace fulgur::data::detail {
namespace {

[[noreturn]] void fail(std::string_view reader, const std::string& what, const std::string& path, int error) {
  throw DataError(std::string(reader) + ": cannot " + what + " " + path + ": " + std::strerror(error) +
                  "; check the path and its permissions.");
}

/// Closes the descriptor on every way out of the constructor: the mapping outlives it (mmap(2)),
/// so a dataset holds no descriptor, however many files it maps.
struct Descriptor {
  int fd;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

int advice_of(Access access) {
  switch (access) {
    case Access::random:
      return MADV_RANDOM;
    case Access::sequential:
      return MADV_SEQUENTIAL;
    case Access::normal:
      break;
  }
  return MADV_NORMAL;
}

}  // namespace

MappedFile::MappedFile(std::string path, Access access, std::string_view reader) : path_(std::move(path)) {
  const Descriptor file{::open(path_.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) fail(reader, "open", path_, errno);
  struct stat info {};
  if (::fstat(file.fd, &info) != 0) fail(reader, "read the size of", path_, errno);
  // A folder opens read-only, and a pipe or device has no size to map.
  if (!S_ISREG(info.st_mode))
    throw DataError(std::string(reader) + ": cannot map " + path_ +
                    ": it is not a regular file; give the path of a data file.");
  size_ = static_cast<std::size_t>(info.st_size);
  if (size_ == 0) return;
  void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, file.fd, 0);
  if (mapped == MAP_FAILED) {
    const int error = errno;
    size_ = 0;
    fail(reader, "memory-map", path_, error);
  }
  data_ = static_cast<const std::byte*>(mapped);
  if (access != Access::normal) advise(access);
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::advise(Access access) const noexcept {
  // Only a hint: a failure (an old kernel, a file system without read-ahead) leaves reads correct.
  if (data_ != nullptr) (void)::madvise(const_cast<std::byte*>(data_), size_, advice_of(access));
}

void MappedFile::release() noexcept {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace fulgur::data::detail
