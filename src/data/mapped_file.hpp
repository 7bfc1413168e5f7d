#pragma once
// fulgur::data::detail::MappedFile: a whole file mapped read-only, for the memory-mapped readers
// (NpyArray, TokenDataset). Private to libfulgur: the public classes hold it through a
// shared_ptr to a forward-declared type, so installed headers never include this one.
//
// The mapping is PROT_READ and MAP_SHARED: pages come from the page cache, so many readers (worker
// threads, processes on one machine) share one copy, and a write through a pointer into it faults.
// The file must not shrink while it is mapped: a read past its new end is SIGBUS (POSIX), which
// no check here can prevent.
#include <cstddef>
#include <string>
#include <string_view>

namespace fulgur::data::detail {

/// How the readers will go through the file, passed to madvise(2) as a hint.
enum class Access {
  normal,      // the kernel's read-around: good for multi-page samples and for in-order epochs
  random,      // no read-ahead: small samples read in shuffled order from a file not in the cache
  sequential,  // aggressive read-ahead, pages dropped soon after they are read
};

class MappedFile {
 public:
  /// Maps the whole of `path`; a DataError naming `reader` (the class reading the file), the path
  /// and the OS reason if it cannot. An empty file maps to data() == nullptr, size() == 0 (mmap
  /// refuses a length of 0).
  explicit MappedFile(std::string path, Access access = Access::normal, std::string_view reader = "fulgur");
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  const std::string& path() const noexcept { return path_; }

  /// Changes the madvise hint for the whole mapping; a kernel that refuses it changes nothing.
  void advise(Access access) const noexcept;

 private:
  void release() noexcept;

  std::string path_;
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace fulgur::data::detail
