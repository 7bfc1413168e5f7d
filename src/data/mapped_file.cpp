// fulgur::data::detail::MappedFile (src/data/mapped_file.hpp).
#include "src/data/mapped_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
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

// ---- a write into a mapping: the crash says what it was ---------------------------------------------
// A sample is a view of the read-only mapping (zero copy), so an in-place op on it (x.sub_(mean) in a
// dataset's get) faults. Without a word that is a bare "Segmentation fault" from a worker thread; a
// SIGSEGV handler, installed with a mapping, names the file and the fix when the faulting address
// is in one of fulgur's mappings, then hands the signal back to the handler it replaced (the default: the
// process ends with SIGSEGV, as before). Everything it touches is async-signal-safe: lock-free atomics,
// fixed buffers, write(2), sigaction(2).

struct MappingSlot {
  std::atomic<std::uintptr_t> begin{0}, end{0};
  std::atomic<bool> taken{false};
  char text[512]{};  // "<reader>'s read-only memory map of <path>", cut to fit
};
constexpr std::size_t kMappingSlots = 128;  // mappings named; more still fault, with the general words
MappingSlot mapping_slots[kMappingSlots];
struct sigaction previous_segv_action {};

void say(const char* text) {
  std::size_t length = 0;
  while (text[length] != '\0') ++length;
  while (length > 0) {
    const ssize_t written = ::write(STDERR_FILENO, text, length);
    if (written <= 0) return;
    text += written;
    length -= static_cast<std::size_t>(written);
  }
}

void on_segv(int signal, siginfo_t* info, void* /*context*/) {
  const auto address = reinterpret_cast<std::uintptr_t>(info->si_addr);
  for (const MappingSlot& slot : mapping_slots) {
    const std::uintptr_t begin = slot.begin.load(std::memory_order_acquire);
    if (begin != 0 && address >= begin && address < slot.end.load(std::memory_order_acquire)) {
      say("\nfulgur: a tensor that views ");
      say(slot.text);
      say(" was written in place (an in-place op such as sub_ or add_ on a sample): the process stops with "
          "SIGSEGV. Clone the sample before changing it (auto x = array.get(i).clone(); x.sub_(mean);), or use "
          "out-of-place ops (x = (x - mean) / std).\n");
      break;
    }
  }
  // The handler it replaced takes over: a fault repeats on return and reaches it; a SIGSEGV sent by
  // kill/raise (si_code <= 0) would not repeat, so it is sent again (pending until this handler returns).
  ::sigaction(SIGSEGV, &previous_segv_action, nullptr);
  if (info->si_code <= 0) ::raise(signal);
}

void name_mapping(const void* data, std::size_t size, std::string_view reader, const std::string& path) {
  {
    // Installed with each mapping unless it is the handler now: one installed since (a test framework's,
    // a crash reporter's) stays the one this hands on to.
    static std::mutex installing;
    const std::lock_guard lock(installing);
    struct sigaction current {};
    ::sigaction(SIGSEGV, nullptr, &current);
    if ((current.sa_flags & SA_SIGINFO) == 0 || current.sa_sigaction != on_segv) {
      struct sigaction action {};
      action.sa_sigaction = on_segv;
      action.sa_flags = SA_SIGINFO | SA_ONSTACK;  // SA_ONSTACK: a thread's alternate stack, where it has one
      sigemptyset(&action.sa_mask);
      previous_segv_action = current;
      ::sigaction(SIGSEGV, &action, nullptr);
    }
  }
  for (MappingSlot& slot : mapping_slots) {
    if (slot.taken.exchange(true, std::memory_order_acq_rel)) continue;
    const std::string text = std::string(reader) + "'s read-only memory map of " + path;
    std::memcpy(slot.text, text.data(), std::min(text.size(), sizeof slot.text - 1));
    slot.text[std::min(text.size(), sizeof slot.text - 1)] = '\0';
    slot.end.store(reinterpret_cast<std::uintptr_t>(data) + size, std::memory_order_release);
    slot.begin.store(reinterpret_cast<std::uintptr_t>(data), std::memory_order_release);
    return;
  }
}

void forget_mapping(const void* data) {
  for (MappingSlot& slot : mapping_slots)
    if (slot.begin.load(std::memory_order_acquire) == reinterpret_cast<std::uintptr_t>(data)) {
      slot.begin.store(0, std::memory_order_release);
      slot.taken.store(false, std::memory_order_release);
      return;
    }
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
  name_mapping(data_, size_, reader, path_);
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
  if (data_ != nullptr) {
    forget_mapping(data_);
    ::munmap(const_cast<std::byte*>(data_), size_);
  }
  data_ = nullptr;
  size_ = 0;
}

}  // namespace fulgur::data::detail
