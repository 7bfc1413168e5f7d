// Checkpoint files, module state and optimizer state.
#include "fulgur/checkpoint/io.hpp"
#include "fulgur/detail/files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/csrc/jit/serialization/unpickler.h>
#include <torch/serialize.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <mutex>
#include <new>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "fulgur/detail/describe.hpp"
#include "fulgur/errors.hpp"

namespace fulgur::checkpoint {

namespace {
/// path: the checkpoint being saved; step: what failed, naming the file it failed on.
[[noreturn]] void save_error(const std::string& path, const std::string& step, int error) {
  throw CheckpointError("fulgur: cannot save checkpoint '" + path + "': " + step + ": " + std::strerror(error) +
                        "; nothing was replaced (a checkpoint already at the destination is intact). Free space, "
                        "fix the folder's permissions, or save elsewhere.");
}

void write_all(int fd, const char* data, std::size_t size, const std::string& path, const std::string& temporary) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      save_error(path, "cannot write '" + temporary + "'", errno);
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

void collect_module_state(const torch::nn::Module& module, const std::string& prefix, StateDict& out) {
  for (const auto& item : module.named_parameters(/*recurse=*/false)) out.insert(prefix + item.key(), item.value().detach());
  for (const auto& item : module.named_buffers(/*recurse=*/false)) out.insert(prefix + item.key(), item.value().detach());
  for (const auto& child : module.named_children()) collect_module_state(*child.value(), prefix + child.key() + ".", out);
}

std::string file_name(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string quoted_list(const std::vector<std::string>& keys) {
  std::string out;
  for (std::size_t i = 0; i < keys.size(); ++i) out += (i ? ", \"" : "\"") + keys[i] + "\"";
  return out;
}

/// ".name.tmp.<pid>" -> pid; 0 for any other name.
pid_t temporary_owner(const std::string& entry, const std::string& prefix) {
  if (entry.size() <= prefix.size() || entry.size() > prefix.size() + 9 || entry.compare(0, prefix.size(), prefix) != 0)
    return 0;
  pid_t pid = 0;
  for (std::size_t i = prefix.size(); i < entry.size(); ++i) {
    if (entry[i] < '0' || entry[i] > '9') return 0;
    pid = pid * 10 + (entry[i] - '0');
  }
  return pid;
}

/// Removes the temporary files that writers killed mid-save left for this path. One is stale when
/// its process is gone and nobody holds the lock every writer keeps on its temporary file (a
/// writer in another PID namespace that shares the folder keeps its own).
void remove_stale_temporaries(const std::string& folder, const std::string& name) {
  DIR* dir = ::opendir(folder.c_str());
  if (dir == nullptr) return;
  const std::string prefix = "." + name + ".tmp.";
  std::vector<std::string> stale;
  while (const dirent* entry = ::readdir(dir)) {
    const pid_t pid = temporary_owner(entry->d_name, prefix);
    if (pid > 0 && pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH) stale.push_back(folder + "/" + entry->d_name);
  }
  ::closedir(dir);
  for (const std::string& path : stale) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) == 0) ::unlink(path.c_str());
    ::close(fd);
  }
}

// The temporary file's name has the process's id only: two threads saving one path would write
// into the same file.
std::mutex saves_in_this_process;
}  // namespace

void atomic_write(const std::string& path, const std::vector<char>& bytes) {
  const std::string folder = detail::parent_folder(path);
  try {
    detail::make_directories(folder);
  } catch (const Error& e) {
    throw CheckpointError(std::string(e.what()) + " (while saving '" + path + "'; nothing was written).");
  }
  const std::lock_guard<std::mutex> one_at_a_time(saves_in_this_process);
  // First, so that the space a killed writer's file holds is free for this one.
  remove_stale_temporaries(folder, file_name(path));
  const std::string temporary = folder + "/." + file_name(path) + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) save_error(path, "cannot create '" + temporary + "'", errno);
  ::flock(fd, LOCK_EX | LOCK_NB);  // held until close: "a writer is alive" (best effort, see above)
  int error = 0;
  try {
    write_all(fd, bytes.data(), bytes.size(), path, temporary);
    if (::fsync(fd) != 0) save_error(path, "cannot fsync '" + temporary + "'", errno);
  } catch (...) {
    ::unlink(temporary.c_str());
    ::close(fd);
    throw;
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    error = errno;
    ::unlink(temporary.c_str());
  }
  ::close(fd);
  if (error != 0) save_error(path, "cannot rename '" + temporary + "' onto it", error);
  // The rename is durable only once the folder's entry is on disk.
  const int dir = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

namespace {
/// A copy that torch.load reads anywhere: tensors detached, on the CPU (location 'cpu', so a machine
/// without the training device reads them), and no larger than they are (a view of a bigger storage
/// would write all of it).
c10::IValue portable(const c10::IValue& value) {
  if (value.isTensor()) {
    at::Tensor t = value.toTensor().detach();
    if (!t.defined()) return value;
    if (!t.is_cpu()) t = t.cpu();
    if (!t.is_contiguous() || t.storage_offset() != 0 ||
        t.storage().nbytes() != static_cast<std::size_t>(t.numel()) * t.itemsize())
      t = t.contiguous().clone();
    return t;
  }
  if (value.isGenericDict()) {
    const auto dict = value.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), dict.valueType());
    for (const auto& item : dict) out.insert(item.key(), portable(item.value()));
    return out;
  }
  if (value.isList()) {
    // Of element type Any: a list typed Tensor/int/float/bool would be pickled through
    // torch.jit._pickle.build_tensorlist & co., which weights-only loading refuses.
    const auto list = value.toList();
    c10::impl::GenericList out(c10::AnyType::get());
    for (const c10::IValue element : list) out.push_back(portable(element));
    return out;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const auto& element : value.toTupleRef().elements()) elements.push_back(portable(element));
    return c10::ivalue::Tuple::create(std::move(elements));
  }
  return value;
}
}  // namespace

// torch::pickle_save tags every dict and list with its element types through
// torch.jit._pickle.restore_type_tag, a global that torch.load(weights_only=True) (the default since
// torch 2.6) refuses. The same zip written by a pickler without those tags holds only what Python's
// own torch.save writes for a dict of tensors, numbers and strings.
std::vector<char> to_bytes(const StateDict& state) {
  std::vector<char> pickled;
  torch::jit::Pickler pickler([&](const char* bytes, std::size_t size) { pickled.insert(pickled.end(), bytes, bytes + size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(portable(state.to_ivalue()));
  pickler.stop();
  std::vector<char> out;
  out.reserve(pickled.size());
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, std::size_t size) {
    out.insert(out.end(), static_cast<const char*>(bytes), static_cast<const char*>(bytes) + size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();
  return out;
}

// ---- reading -------------------------------------------------------------------------------------
// LibTorch's reader trusts the file: a data.pkl of a million TUPLE1 opcodes overflows the stack when
// the tuples are freed, a tensor whose size or storage claims more bytes than its record reads past
// the record, a forged memo index or string length allocates gigabytes, and a flipped bit in a tensor
// loads silently (its zip reader skips the CRC-32). The reader below checks the zip, the pickle and
// the tensors itself, so that such a file is a CheckpointError, never a crash or a wrong tensor.
namespace {
static_assert(std::endian::native == std::endian::little, "the zip and pickle readers below read little-endian");

constexpr std::size_t kSmallestZip = 22;    // an empty zip is its end-of-central-directory record alone
constexpr std::size_t kMaxNesting = 1000;   // containers within containers; LibTorch frees them recursively

/// The messages: what is wrong with the file and what to do.
struct Complaint {
  std::string what;  // "checkpoint '/path'"
  std::size_t size = 0;

  [[noreturn]] void not_a_checkpoint(const std::string& problem) const {
    throw CheckpointError("fulgur: " + what + " is not a checkpoint: " + problem +
                          ". Pass a file written by fulgur (Trainer::save_checkpoint, Fabric save) or by torch.save.");
  }
  [[noreturn]] void truncated(const std::string& problem) const {
    throw CheckpointError("fulgur: " + what + " is truncated (" + std::to_string(size) + " bytes): " + problem +
                          ". A save that is cut short never replaces the file, so it was cut while being copied or "
                          "downloaded: copy it again, or resume from an earlier checkpoint.");
  }
  [[noreturn]] void corrupt(const std::string& problem) const {
    throw CheckpointError("fulgur: " + what + " is corrupt: " + problem +
                          ". Copy it again from where it was saved, or resume from an earlier checkpoint.");
  }
};

std::uint64_t le(const unsigned char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}
/// [at, at + n) lies within [0, limit), without overflow.
bool fits(std::uint64_t at, std::uint64_t n, std::uint64_t limit) { return at <= limit && n <= limit - at; }

std::uint32_t crc32(const unsigned char* data, std::size_t size) {
  static const auto table = [] {
    std::array<std::array<std::uint32_t, 256>, 8> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[0][i] = c;
    }
    for (std::uint32_t i = 0; i < 256; ++i)
      for (std::size_t s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    return t;
  }();
  std::uint32_t c = 0xFFFFFFFFu;
  for (; size >= 8; data += 8, size -= 8) {  // slicing-by-8
    std::uint32_t lo, hi;
    std::memcpy(&lo, data, 4);
    std::memcpy(&hi, data + 4, 4);
    lo ^= c;
    c = table[7][lo & 0xFF] ^ table[6][(lo >> 8) & 0xFF] ^ table[5][(lo >> 16) & 0xFF] ^ table[4][lo >> 24] ^
        table[3][hi & 0xFF] ^ table[2][(hi >> 8) & 0xFF] ^ table[1][(hi >> 16) & 0xFF] ^ table[0][hi >> 24];
  }
  for (; size > 0; ++data, --size) c = table[0][(c ^ *data) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

struct ZipRecord {
  std::string name;
  std::uint64_t data = 0, stored = 0, size = 0;  // offset of the bytes, their count, and uncompressed
  std::uint32_t crc = 0;
  std::uint16_t method = 0;
};

/// The zip's records, each checked against the file as miniz (LibTorch's zip reader) reads them:
/// the end record found the same way, every record's header and bytes inside the file before the
/// directory, sizes that stored bytes can have, and the CRC-32 of stored records.
std::vector<ZipRecord> read_zip_directory(const unsigned char* b, std::uint64_t size, const Complaint& complain) {
  if (size < kSmallestZip) complain.truncated("a zip archive has at least 22 bytes");
  std::uint64_t eocd = size;  // the last end record, within the largest comment's reach of the end
  const std::uint64_t lowest = size > kSmallestZip + 0xFFFF ? size - kSmallestZip - 0xFFFF : 0;
  for (std::uint64_t at = size - kSmallestZip + 1; at-- > lowest;)
    if (le(b + at, 4) == 0x06054b50) {
      eocd = at;
      break;
    }
  if (eocd == size) complain.truncated("the zip directory that ends every checkpoint is missing");
  std::uint64_t disk = le(b + eocd + 4, 2), directory_disk = le(b + eocd + 6, 2), on_disk = le(b + eocd + 8, 2);
  std::uint64_t entries = le(b + eocd + 10, 2), directory_size = le(b + eocd + 12, 4), directory = le(b + eocd + 16, 4);
  std::uint64_t directory_limit = eocd;
  if (eocd >= 20 && le(b + eocd - 20, 4) == 0x07064b50) {  // the zip64 locator: torch.save always writes one
    const std::uint64_t locator = eocd - 20, z = le(b + locator + 8, 8);
    if (!fits(z, 56, locator) || le(b + z, 4) != 0x06064b50 || le(b + z + 4, 8) < 44 || le(b + locator + 16, 4) != 1)
      complain.corrupt("its zip64 end record is missing or damaged");
    disk = le(b + z + 16, 4), directory_disk = le(b + z + 20, 4), on_disk = le(b + z + 24, 8);
    entries = le(b + z + 32, 8), directory_size = le(b + z + 40, 8), directory = le(b + z + 48, 8);
    directory_limit = z;
  }
  if (disk != 0 || directory_disk != 0 || on_disk != entries) complain.corrupt("its zip end record is damaged");
  if (entries == 0) complain.not_a_checkpoint("it is an empty zip archive");
  if (!fits(directory, directory_size, directory_limit) || directory_size / 46 < entries)
    complain.corrupt("its zip directory lies outside the file or is shorter than its " + std::to_string(entries) +
                     " entries");
  std::vector<ZipRecord> records;
  records.reserve(entries);
  const std::uint64_t directory_end = directory + directory_size;
  std::uint64_t p = directory;
  for (std::uint64_t i = 0; i < entries; ++i) {
    if (!fits(p, 46, directory_end) || le(b + p, 4) != 0x02014b50)
      complain.corrupt("entry " + std::to_string(i) + " of its zip directory is damaged");
    ZipRecord r;
    const auto flags = le(b + p + 8, 2);
    r.method = static_cast<std::uint16_t>(le(b + p + 10, 2));
    r.crc = static_cast<std::uint32_t>(le(b + p + 16, 4));
    r.stored = le(b + p + 20, 4), r.size = le(b + p + 24, 4);
    const std::uint64_t name_size = le(b + p + 28, 2), extra_size = le(b + p + 30, 2), comment_size = le(b + p + 32, 2);
    std::uint64_t header = le(b + p + 42, 4);
    if (!fits(p + 46, name_size + extra_size + comment_size, directory_end))
      complain.corrupt("entry " + std::to_string(i) + " of its zip directory is damaged");
    r.name.assign(reinterpret_cast<const char*>(b + p + 46), name_size);
    const std::string record = "record '" + r.name + "'";
    if (r.stored == 0xFFFFFFFF || r.size == 0xFFFFFFFF || header == 0xFFFFFFFF) {
      // zip64: the values that do not fit in 32 bits follow, in this order, in the extra field with id 1.
      bool found = false;
      for (std::uint64_t e = p + 46 + name_size, end = e + extra_size; !found && fits(e, 4, end);) {
        const std::uint64_t id = le(b + e, 2), length = le(b + e + 2, 2);
        if (!fits(e + 4, length, end)) break;
        if (id == 1) {
          found = true;
          std::uint64_t f = e + 4;
          for (std::uint64_t* field : {&r.size, &r.stored, &header}) {
            if (*field != 0xFFFFFFFF) continue;
            if (!fits(f, 8, e + 4 + length)) found = false;
            else *field = le(b + f, 8), f += 8;
          }
          if (!found) break;
        }
        e += 4 + length;
      }
      if (!found) complain.corrupt("the 64-bit sizes of " + record + " are missing");
    }
    if (r.name.empty()) complain.corrupt("entry " + std::to_string(i) + " of its zip directory has no name");
    if (flags & 1) complain.not_a_checkpoint(record + " is encrypted");
    if (r.method != 0 && r.method != 8)
      complain.not_a_checkpoint(record + " is compressed with zip method " + std::to_string(r.method) +
                                ", which LibTorch cannot read");
    // miniz skips a record that is marked as a folder: LibTorch would read its uninitialized buffer.
    if ((r.name.back() == '/' || (le(b + p + 38, 4) & 0x10) != 0) && r.size > 0)
      complain.corrupt(record + " is marked as a folder, so its bytes would not be read");
    if (r.method == 0 && r.stored != r.size)
      complain.corrupt(record + " stores " + std::to_string(r.stored) + " bytes but says it holds " +
                       std::to_string(r.size));
    if (r.method == 8 && r.size / 1032 > r.stored)  // deflate expands at most 1032-fold
      complain.corrupt(record + " claims more bytes than its compressed data can hold");
    if (!fits(header, 30, directory) || le(b + header, 4) != 0x04034b50)
      complain.corrupt("the header of " + record + " is missing or damaged");
    r.data = header + 30 + le(b + header + 26, 2) + le(b + header + 28, 2);
    if (!fits(r.data, r.stored, directory)) complain.corrupt("the bytes of " + record + " run into the zip directory");
    if (r.method == 0 && (r.crc != 0 || r.size == 0) && crc32(b + r.data, r.size) != r.crc)  // 0: not computed
      complain.corrupt(record + " fails its CRC-32 check: its bytes changed after it was written");
    records.push_back(std::move(r));
    p += 46 + name_size + extra_size + comment_size;
  }
  return records;
}

/// LibTorch's zip reader reads through this; unlike its VectorReader, a read past the end comes back short.
class MemoryReader final : public caffe2::serialize::ReadAdapterInterface {
 public:
  MemoryReader(const char* data, std::size_t size) : data_(data), size_(size) {}
  std::size_t size() const override { return size_; }
  std::size_t read(std::uint64_t pos, void* buf, std::size_t n, const char* /*what*/) const override {
    if (pos >= size_) return 0;
    n = static_cast<std::size_t>(std::min<std::uint64_t>(n, size_ - pos));
    std::memcpy(buf, data_ + pos, n);
    return n;
  }

 private:
  const char* data_;
  std::size_t size_;
};

/// A dry run of LibTorch's Unpickler (torch/csrc/jit/serialization/unpickler.cpp) over the opcodes it
/// reads. Of each value it keeps only what proves that LibTorch stays in bounds: which container it
/// is (to measure nesting and find a list that holds itself) and which global it names. It accepts
/// what Python's torch.save and LibTorch's picklers write for dicts, lists, tuples, tensors, numbers
/// and strings; anything else LibTorch would refuse too, or mishandle.
class PickleCheck {
 public:
  PickleCheck(const unsigned char* data, std::size_t size) : data_(data), size_(size) {}

  /// "" when LibTorch can read the pickle safely, or what is wrong with it.
  std::string problem() {
    try {
      run();
      measure_nesting();
      return "";
    } catch (const std::string& problem) {
      return problem;
    }
  }

 private:
  enum class Kind : std::uint8_t { Value, Int, Global, Container };
  struct Slot {
    Kind kind = Kind::Value;
    std::uint32_t index = 0;  // of the global or the container
    std::int64_t value = 0;   // of an Int
  };
  // What calling a global (REDUCE / BUILD) leaves on the stack.
  enum class Call : std::uint8_t { Tensor, TensorFromType, FirstElement, Value, NewDict };
  struct Container {
    Slot first, second;  // of a tuple: restore_type_tag and build_*list return the first; a storage's
                         // second is its element type
    std::size_t size = 0;
  };

  [[noreturn]] void fail(const std::string& problem) const {
    throw "its data.pkl " + problem +
        (pos_ < size_ ? " (byte " + std::to_string(pos_) + " of " + std::to_string(size_) + ")" : std::string());
  }
  std::uint64_t read(int bytes) {
    if (!fits(pos_, static_cast<std::uint64_t>(bytes), size_)) fail("ends in the middle of an opcode");
    const std::uint64_t v = le(data_ + pos_, bytes);
    pos_ += static_cast<std::size_t>(bytes);
    return v;
  }
  void skip(std::uint64_t bytes) {
    if (!fits(pos_, bytes, size_)) fail("holds a string longer than the rest of the file");
    pos_ += static_cast<std::size_t>(bytes);
  }
  void need(std::size_t n) const {
    if (stack_.size() < n) fail("takes more values than its stack holds");
  }
  std::size_t pop_mark() {
    if (marks_.empty() || marks_.back() > stack_.size()) fail("has a MARK that does not match");
    const std::size_t start = marks_.back();
    marks_.pop_back();
    return start;
  }
  Slot new_container() {
    if (containers_.size() >= UINT32_MAX) fail("holds too many containers");
    containers_.push_back({});
    return {Kind::Container, static_cast<std::uint32_t>(containers_.size() - 1)};
  }
  /// The stack's values from `from` on go into `target` (a list, dict or tuple).
  void add(Slot target, std::size_t from) {
    if (target.kind != Kind::Container) fail("adds items to something that is not a list or dictionary");
    for (std::size_t i = from; i < stack_.size(); ++i)
      if (stack_[i].kind == Kind::Container) edges_.push_back({target.index, stack_[i].index});
  }
  void tuple(std::size_t from) {
    const Slot t = new_container();
    Container& c = containers_[t.index];
    c.size = stack_.size() - from;
    if (c.size > 0) c.first = stack_[from];
    if (c.size > 1) c.second = stack_[from + 1];
    add(t, from);
    stack_.resize(from);
    stack_.push_back(t);
  }
  std::string line() {  // a GLOBAL's module or name: a Python identifier ended by '\n'
    const std::size_t start = pos_;
    while (pos_ < size_ && data_[pos_] != '\n') {
      const unsigned char c = data_[pos_];
      if (!(std::isalnum(c) || c == '_' || c == '.')) fail("names a global that is not a Python identifier");
      ++pos_;
    }
    if (pos_ == size_ || pos_ == start) fail("names a global that is not a Python identifier");
    return std::string(reinterpret_cast<const char*>(data_ + start), pos_++ - start);
  }
  void call(Call c) {
    globals_.push_back(c);
    stack_.push_back({Kind::Global, static_cast<std::uint32_t>(globals_.size() - 1)});
  }
  void global() {
    const std::string module = line(), name = line();
    if (skip_globals_ > 0 && --skip_globals_ == 0) {
      // The second global after _rebuild_from_type_v2 (the tensor's class) stands for the first.
      stack_.push_back({Kind::Global, static_cast<std::uint32_t>(globals_.size() - 1)});
      return;
    }
    const bool rebuild_tensor = module == "torch._utils" && (name == "_rebuild_tensor_v2" || name == "_rebuild_qtensor");
    if (skip_globals_ == 1 && !rebuild_tensor) fail("holds a tensor subclass that LibTorch cannot rebuild");
    if (rebuild_tensor) {
      call(Call::Tensor);
    } else if (module == "torch._tensor" && name == "_rebuild_from_type_v2") {
      call(Call::TensorFromType);
      skip_globals_ = 2;
    } else if (module == "torch.jit._pickle" &&
               (name == "restore_type_tag" || name == "build_intlist" || name == "build_tensorlist" ||
                name == "build_doublelist" || name == "build_boollist")) {
      call(Call::FirstElement);
    } else if ((module == "builtins" && name == "complex") || (module == "torch" && name == "device")) {
      call(Call::Value);
    } else if (module == "collections" && name == "OrderedDict") {
      call(Call::NewDict);
    } else if (module == "torch") {
      stack_.push_back({});  // torch.FloatStorage and the like: a valid number, LibTorch checks the name
    } else {
      fail("refers to " + module + "." + name +
           ", which is not part of a dictionary of tensors, numbers and strings (a pickled Python object, or a "
           "TorchScript module?)");
    }
  }
  void reduce() {
    need(2);
    const Slot function = stack_[stack_.size() - 2], argument = stack_.back();
    stack_.resize(stack_.size() - 2);
    if (function.kind != Kind::Global) fail("calls something that is not a global");
    switch (globals_[function.index]) {
      case Call::TensorFromType:
        // LibTorch calls the global that follows it without checking that there is one.
        if (function.index + 1 >= globals_.size() || globals_[function.index + 1] != Call::Tensor)
          fail("holds a tensor subclass that LibTorch cannot rebuild");
        [[fallthrough]];
      case Call::Tensor:
      case Call::Value:
        stack_.push_back({});
        break;
      case Call::FirstElement:
        stack_.push_back(argument.kind == Kind::Container ? containers_[argument.index].first : Slot{});
        break;
      case Call::NewDict:
        stack_.push_back(new_container());
        break;
    }
  }
  void integer(std::int64_t v) { stack_.push_back({Kind::Int, 0, v}); }
  /// ('storage', element type, key, location, count) -> a tensor. LibTorch casts the element type to
  /// c10::ScalarType unchecked (in a release build) and indexes its type tables with it.
  void storage() {
    need(1);
    const Slot t = stack_.back();
    if (t.kind == Kind::Container && containers_[t.index].size > 1) {
      const Slot type = containers_[t.index].second;
      if (type.kind == Kind::Int &&
          (type.value < 0 || type.value >= static_cast<std::int64_t>(c10::ScalarType::Undefined)))
        fail("holds a storage of unknown element type " + std::to_string(type.value));
    }
    stack_.back() = {};
  }
  void memo_get(std::uint64_t id) {
    if (id >= memo_.size()) fail("reads a memo entry it never wrote");
    stack_.push_back(memo_[id]);
  }
  void memo_put(std::uint64_t id) {
    need(1);
    if (id > size_) fail("writes a memo entry far beyond any pickler's numbering");  // LibTorch would allocate up to it
    if (id >= memo_.size()) memo_.resize(id + 1);
    memo_[id] = stack_.back();
  }

  void run() {
    if (size_ < 2 || data_[0] != 0x80 || data_[1] != 2) fail("is not a protocol-2 pickle");
    pos_ = 2;
    for (;;) {
      if (pos_ >= size_) fail("ends before its STOP opcode");
      const unsigned char op = data_[pos_++];
      switch (op) {
        case '(': marks_.push_back(stack_.size()); break;                          // MARK
        case ')': tuple(stack_.size()); break;                                     // EMPTY_TUPLE
        case 'N': case 0x88: case 0x89: stack_.push_back({}); break;               // NONE NEWTRUE NEWFALSE
        case 'K': integer(static_cast<std::int64_t>(read(1))); break;              // BININT1
        case 'M': integer(static_cast<std::int64_t>(read(2))); break;              // BININT2
        case 'J': integer(static_cast<std::int32_t>(read(4))); break;              // BININT
        case 'G': skip(8), stack_.push_back({}); break;                            // BINFLOAT
        case 0x8a: {                                                               // LONG1 (LibTorch: 8 bytes only)
          if (read(1) != 8) fail("holds an integer longer than 64 bits");
          integer(static_cast<std::int64_t>(read(8)));
        } break;
        case 'X': skip(read(4)), stack_.push_back({}); break;                      // BINUNICODE
        case 0x8d: skip(read(8)), stack_.push_back({}); break;                     // BINUNICODE8
        case ']': case '}': stack_.push_back(new_container()); break;              // EMPTY_LIST EMPTY_DICT
        case 0x85: case 0x86: case 0x87: {                                         // TUPLE1..3
          const std::size_t n = op - 0x84u;
          need(n);
          tuple(stack_.size() - n);
        } break;
        case 't': tuple(pop_mark()); break;                                        // TUPLE
        case 'a': {                                                                // APPEND
          need(2);
          add(stack_[stack_.size() - 2], stack_.size() - 1);
          stack_.pop_back();
        } break;
        case 'e': {                                                                // APPENDS
          const std::size_t start = pop_mark();
          if (start == 0) fail("appends to nothing");
          add(stack_[start - 1], start);
          stack_.resize(start);
        } break;
        case 'l': {                                                                // LIST
          const std::size_t start = pop_mark();
          const Slot list = new_container();
          add(list, start);
          stack_.resize(start);
          stack_.push_back(list);
        } break;
        case 'd': case 'u': {                                                      // DICT SETITEMS
          const std::size_t start = pop_mark();
          if ((stack_.size() - start) % 2 != 0) fail("holds a key without a value");
          if (op == 'u' && start == 0) fail("sets items of nothing");
          const Slot dict = op == 'd' ? new_container() : stack_[start - 1];
          add(dict, start);
          stack_.resize(start);
          if (op == 'd') stack_.push_back(dict);
        } break;
        case 's': {                                                                // SETITEM
          need(3);
          add(stack_[stack_.size() - 3], stack_.size() - 2);
          stack_.resize(stack_.size() - 2);
        } break;
        case 'h': memo_get(read(1)); break;                                        // BINGET
        case 'j': memo_get(read(4)); break;                                        // LONG_BINGET
        case 'q': memo_put(read(1)); break;                                        // BINPUT
        case 'r': memo_put(read(4)); break;                                        // LONG_BINPUT
        case 'c': global(); break;                                                 // GLOBAL
        case 0x81: need(1), stack_.pop_back(); break;                              // NEWOBJ
        case 'R': case 'b': reduce(); break;                                       // REDUCE BUILD
        case 'Q': storage(); break;                                                // BINPERSID
        case '.': return;                                                          // STOP
        default: {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", op);
          --pos_;
          fail(std::string("holds opcode ") + hex + ", which LibTorch cannot read");
        }
      }
    }
  }

  /// LibTorch frees nested containers recursively (and a container that holds itself never): bound
  /// the depth of every container this pickle builds, reachable from the result or not.
  void measure_nesting() {
    pos_ = size_;  // no byte to point at
    const std::size_t n = containers_.size();
    std::vector<std::uint32_t> first_edge(n + 1, 0), targets(edges_.size());
    for (const auto& e : edges_) ++first_edge[e.first + 1];
    for (std::size_t i = 0; i < n; ++i) first_edge[i + 1] += first_edge[i];
    {
      std::vector<std::uint32_t> next(first_edge.begin(), first_edge.end() - 1);
      for (const auto& e : edges_) targets[next[e.first]++] = e.second;
    }
    std::vector<std::uint32_t> height(n, 0);  // 0: not measured yet
    std::vector<bool> on_path(n, false);
    struct Frame {
      std::uint32_t node, next_edge, height;
    };
    std::vector<Frame> path;
    for (std::uint32_t root = 0; root < n; ++root) {
      if (height[root] != 0) continue;
      path.push_back({root, first_edge[root], 1});
      on_path[root] = true;
      while (!path.empty()) {
        Frame& f = path.back();
        if (f.next_edge < first_edge[f.node + 1]) {
          const std::uint32_t child = targets[f.next_edge++];
          if (on_path[child]) fail("holds a list or dictionary that contains itself");
          if (height[child] != 0) {
            f.height = std::max(f.height, height[child] + 1);
          } else {
            if (path.size() >= kMaxNesting) fail("nests containers more than " + std::to_string(kMaxNesting) + " deep");
            on_path[child] = true;
            path.push_back({child, first_edge[child], 1});
          }
          continue;
        }
        const std::uint32_t done = f.height;
        height[f.node] = done;
        on_path[f.node] = false;
        path.pop_back();
        if (done > kMaxNesting) fail("nests containers more than " + std::to_string(kMaxNesting) + " deep");
        if (!path.empty()) path.back().height = std::max(path.back().height, done + 1);
      }
    }
  }

  const unsigned char* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  std::vector<Slot> stack_;
  std::vector<std::size_t> marks_;
  std::vector<Slot> memo_;
  std::vector<Call> globals_;
  int skip_globals_ = 0;
  std::vector<Container> containers_;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> edges_;  // container -> container it holds
};

/// Every tensor's elements lie within its storage and every storage within the record it was read from
/// (LibTorch sizes a storage by the pickle's element count and sets sizes, strides and offsets as given).
void check_tensors(const c10::IValue& value, const std::string& where,
                   const std::unordered_map<const void*, std::size_t>& record_sizes,
                   std::unordered_set<const void*>& seen, const Complaint& complain) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (!t.defined() || t.is_meta()) return;
    if (t.layout() != c10::kStrided || !t.is_cpu()) complain.corrupt("tensor " + where + " is not a dense CPU tensor");
    if (t.is_quantized()) {  // a quantized element type without _rebuild_qtensor's parameters: unusable
      try {
        (void)t.qscheme();
      } catch (const std::exception&) {
        complain.corrupt("tensor " + where + " is quantized but has no quantization parameters");
      }
    }
    const std::size_t bytes = t.storage().nbytes();
    const auto record = record_sizes.find(t.storage().data());
    if (bytes > 0 && (record == record_sizes.end() || record->second < bytes))
      complain.corrupt("the storage of tensor " + where + " claims " + std::to_string(bytes) +
                       " bytes, more than its record holds");
    if (t.numel() == 0) return;
    __int128 last = t.storage_offset();
    bool negative = last < 0;
    for (std::int64_t d = 0; d < t.dim(); ++d) {
      negative = negative || t.stride(d) < 0;
      last += static_cast<__int128>(t.size(d) - 1) * t.stride(d);
    }
    const std::string view = "tensor " + where + " (shape " + c10::str(t.sizes()) + ", strides " +
                             c10::str(t.strides()) + ", offset " + std::to_string(t.storage_offset()) + ")";
    if (negative) complain.corrupt(view + " has a negative stride or offset");
    if ((last + 1) * t.element_size() > static_cast<__int128>(bytes))
      complain.corrupt(view + " reaches past its storage of " + std::to_string(bytes) + " bytes");
    return;
  }
  if (!(value.isGenericDict() || value.isList() || value.isTuple())) return;
  if (!seen.insert(value.internalToPointer()).second) return;
  if (value.isGenericDict()) {
    for (const auto& item : value.toGenericDict()) {
      const std::string key = item.key().isString() ? item.key().toStringRef() : "?";
      check_tensors(item.key(), where + "[key]", record_sizes, seen, complain);
      check_tensors(item.value(), where.empty() ? "'" + key + "'" : where + "['" + key + "']", record_sizes, seen, complain);
    }
  } else if (value.isList()) {
    const auto list = value.toListRef();
    for (std::size_t i = 0; i < list.size(); ++i)
      check_tensors(list[i], where + "[" + std::to_string(i) + "]", record_sizes, seen, complain);
  } else {
    const auto& elements = value.toTupleRef().elements();
    for (std::size_t i = 0; i < elements.size(); ++i)
      check_tensors(elements[i], where + "[" + std::to_string(i) + "]", record_sizes, seen, complain);
  }
}

/// Why bytes that are not a zip are not a checkpoint, in the user's terms.
[[noreturn]] void not_a_zip(const unsigned char* b, std::size_t size, const Complaint& complain) {
  if (std::all_of(b, b + size, [](unsigned char c) { return c == 0; }))
    complain.corrupt("all of its " + std::to_string(size) +
                     " bytes are zero (its data never reached the disk: a crash while a tool that does not fsync "
                     "wrote it?)");
  if (b[0] == 0x80)
    complain.not_a_checkpoint(
        "it is a legacy torch.save file (PyTorch before 1.6, or _use_new_zipfile_serialization=False), which "
        "LibTorch cannot read; re-save it in Python with torch.save(torch.load(path), path)");
  const std::size_t head = std::min<std::size_t>(size, 256);
  const bool text = std::all_of(b, b + head, [](unsigned char c) { return c >= 0x20 || c == '\n' || c == '\r' || c == '\t'; });
  if (text) {
    std::string start(reinterpret_cast<const char*>(b), std::min<std::size_t>(head, 40));
    start = start.substr(0, start.find_first_of("\r\n"));
    complain.not_a_checkpoint("it is a text file (it begins \"" + start + "\")");
  }
  char first[40];
  std::snprintf(first, sizeof first, "%02x %02x %02x %02x", b[0], size > 1 ? b[1] : 0, size > 2 ? b[2] : 0,
                size > 3 ? b[3] : 0);
  complain.not_a_checkpoint(std::string("it is not the zip archive torch.save writes (it begins with the bytes ") +
                            first + " where a zip has 50 4b 03 04)");
}

StateDict from_memory(const char* data, std::size_t size, const std::string& what) {
  const Complaint complain{what, size};
  const auto* b = reinterpret_cast<const unsigned char*>(data);
  if (size == 0)
    throw CheckpointError("fulgur: " + what + " is empty (0 bytes), so it is not a checkpoint: a save that never "
                          "finished leaves no such file, so something else wrote it. Resume from an earlier checkpoint.");
  if (size < 4 || std::memcmp(data, "PK\x03\x04", 4) != 0) not_a_zip(b, size, complain);
  const std::vector<ZipRecord> records = read_zip_directory(b, size, complain);
  const auto slash = records.front().name.find('/');
  if (slash == std::string::npos)
    complain.not_a_checkpoint("its first record '" + records.front().name + "' is not in a folder, as torch.save writes them");
  const std::string pickle_name = records.front().name.substr(0, slash + 1) + "data.pkl";
  if (std::none_of(records.begin(), records.end(), [&](const ZipRecord& r) { return r.name == pickle_name; }))
    complain.not_a_checkpoint("it is a zip archive without the data.pkl that torch.save writes");

  c10::IValue value;
  std::unordered_map<const void*, std::size_t> record_sizes;
  try {
    caffe2::serialize::PyTorchStreamReader archive(std::make_shared<MemoryReader>(data, size));
    const auto pickle = archive.getRecord("data.pkl");
    const auto* pickled = static_cast<const unsigned char*>(std::get<0>(pickle).get());
    const std::size_t pickle_size = std::get<1>(pickle);
    if (const std::string problem = PickleCheck(pickled, pickle_size).problem(); !problem.empty()) complain.corrupt(problem);
    std::size_t done = 0;
    auto reader = [&](char* buffer, std::size_t n) -> std::size_t {
      n = std::min(n, pickle_size - done);
      std::memcpy(buffer, pickled + done, n);
      done += n;
      return n;
    };
    auto read_record = [&](const std::string& key) {
      auto [record, record_size] = archive.getRecord("data/" + key);
      record_sizes[record.get()] = record_size;
      return std::move(record);
    };
    // Tensors load on the CPU (as Lightning's map_location does): moving one to its saved device would
    // read its storage before check_tensors has seen it.
    torch::jit::Unpickler unpickler(reader, /*type_resolver=*/nullptr, /*obj_loader=*/nullptr, read_record, at::Device(at::kCPU));
    unpickler.set_version(archive.version());
    value = unpickler.parse_ivalue();
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {  // c10::Error, std::bad_alloc, ...
    complain.corrupt("LibTorch cannot read it (" + detail::first_line(e.what()) + ")");
  }
  std::unordered_set<const void*> seen;
  check_tensors(value, "", record_sizes, seen, complain);
  if (!value.isGenericDict())
    complain.not_a_checkpoint("it holds a " + std::string(value.tagKind()) + ", not a dictionary");
  StateDict out;
  for (const auto& item : value.toGenericDict()) {
    if (!item.key().isString()) complain.not_a_checkpoint("it has a non-string key at its top level");
    out.insert(item.key().toStringRef(), item.value());
  }
  return out;
}
}  // namespace

StateDict from_bytes(const std::vector<char>& bytes, const std::string& what) {
  return from_memory(bytes.data(), bytes.size(), what);
}

void save(const std::string& path, const StateDict& state) { atomic_write(path, to_bytes(state)); }

StateDict load(const std::string& path) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer forever (no effect on regular files).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    throw CheckpointError("fulgur: cannot open checkpoint '" + path + "': " + std::strerror(errno) +
                          ". Check the path (a relative one is taken under TrainerConfig::default_root_dir).");
  struct stat info {};
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    const bool folder = S_ISDIR(info.st_mode);
    ::close(fd);
    throw CheckpointError("fulgur: checkpoint '" + path + "' is " + (folder ? "a directory" : "not a regular file") +
                          "; pass the checkpoint file itself (e.g. '" + path + "/last.ckpt').");
  }
  const std::uint64_t memory = static_cast<std::uint64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE);
  std::vector<char> bytes;
  try {
    if (static_cast<std::uint64_t>(info.st_size) > memory) throw std::bad_alloc();
    bytes.resize(static_cast<std::size_t>(info.st_size));
  } catch (const std::bad_alloc&) {
    ::close(fd);
    throw CheckpointError("fulgur: checkpoint '" + path + "' (" + std::to_string(info.st_size) +
                          " bytes) does not fit in this machine's memory (" + std::to_string(memory) +
                          " bytes); load it on a larger machine, or check that it is the file you meant.");
  }
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      throw CheckpointError("fulgur: cannot read checkpoint '" + path + "': " +
                            (n == 0 ? std::string("it ended early (did it shrink while being read?)") : std::strerror(error)) + ".");
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return from_memory(bytes.data(), bytes.size(), "checkpoint '" + path + "'");
}

StateDict module_state_dict(const torch::nn::Module& module) {
  StateDict out;
  collect_module_state(module, "", out);
  return out;
}

void load_module_state_dict(torch::nn::Module& module, const StateDict& state, bool strict) {
  const StateDict own = module_state_dict(module);
  std::vector<std::string> missing, unexpected, mismatched;
  for (const auto& item : own)
    if (!state.contains(item.key().toStringRef())) missing.push_back(item.key().toStringRef());
  for (const auto& item : state)
    if (!own.contains(item.key().toStringRef())) unexpected.push_back(item.key().toStringRef());
  for (const auto& item : own) {
    const std::string& key = item.key().toStringRef();
    if (!state.contains(key)) continue;
    const c10::IValue source = state.at(key);
    const at::Tensor target = item.value().toTensor();
    if (!source.isTensor() || source.toTensor().sizes() != target.sizes())
      mismatched.push_back(key + " (expected shape " + c10::str(target.sizes()) +
                           (source.isTensor() ? ", got " + c10::str(source.toTensor().sizes()) : ", got a non-tensor") + ")");
  }
  if (!mismatched.empty() || (strict && (!missing.empty() || !unexpected.empty()))) {
    std::string message = "Error(s) in loading state_dict for " + module.name() + ":";
    if (strict && !missing.empty()) message += "\n\tMissing key(s) in state_dict: " + quoted_list(missing) + ".";
    if (strict && !unexpected.empty()) message += "\n\tUnexpected key(s) in state_dict: " + quoted_list(unexpected) + ".";
    for (const auto& m : mismatched) message += "\n\tsize mismatch for " + m + ".";
    if (strict) message += "\nTo load only the keys that match, pass strict = false.";
    throw Error(message);
  }
  at::NoGradGuard no_grad;
  for (const auto& item : own) {
    const std::string& key = item.key().toStringRef();
    if (state.contains(key)) item.value().toTensor().copy_(state.at(key).toTensor());
  }
}

// LibTorch's optimizers keep their state in typed per-parameter objects that only its own
// archive format can round-trip exactly; the StateDict carries that archive as bytes.
StateDict optimizer_state_dict(torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream stream;
  archive.save_to(stream);
  const std::string bytes = stream.str();
  StateDict out;
  out.insert("format", std::string("libtorch-optimizer-archive"));
  out.insert("archive", at::from_blob(const_cast<char*>(bytes.data()), {static_cast<std::int64_t>(bytes.size())},
                                      at::kByte)
                            .clone());
  return out;
}

void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const StateDict& state) {
  if (!state.contains("archive") || !state.at("archive").isTensor())
    throw Error("fulgur: the optimizer state has no 'archive' entry; pass a state from optimizer_state_dict().");
  const at::Tensor bytes = state.at("archive").toTensor().contiguous();
  std::istringstream stream(std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel()));
  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  optimizer.load(archive);
}

}  // namespace fulgur::checkpoint
