// Checkpoint files, module state and optimizer state.
#include "fulgur/checkpoint/io.hpp"
#include "fulgur/distributed/shard_state.hpp"
#include "fulgur/distributed/sharded_module_state.hpp"
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
#include <torch/serialize.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
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
/// Wide enough for a product of two 62-bit extents: views are checked without overflow. GCC and
/// clang have it; __extension__ says so to -Wpedantic.
__extension__ typedef __int128 wide_int;

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
/// without the training device reads them), no larger than they are (a view of a bigger storage
/// would write all of it), and no two viewing one storage as different element types (the pickler
/// writes a storage once, with the first one's type, and the second would read past it; Python's
/// torch.save refuses such tensors). `storages`: the element type each storage was written with.
c10::IValue portable(const c10::IValue& value, std::unordered_map<const void*, c10::ScalarType>& storages) {
  if (value.isTensor()) {
    at::Tensor t = value.toTensor().detach();
    if (!t.defined()) return value;
    if (!t.is_cpu()) t = t.cpu();
    if (!t.is_contiguous() || t.storage_offset() != 0 ||
        t.storage().nbytes() != static_cast<std::size_t>(t.numel()) * t.itemsize())
      t = t.contiguous().clone();
    if (!storages.emplace(t.storage().unsafeGetStorageImpl(), t.scalar_type()).second &&
        storages.at(t.storage().unsafeGetStorageImpl()) != t.scalar_type()) {
      t = t.clone();
      storages.emplace(t.storage().unsafeGetStorageImpl(), t.scalar_type());
    }
    return t;
  }
  if (value.isGenericDict()) {
    const auto dict = value.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), dict.valueType());
    for (const auto& item : dict) out.insert(item.key(), portable(item.value(), storages));
    return out;
  }
  if (value.isList()) {
    // Of element type Any: a list typed Tensor/int/float/bool would be pickled through
    // torch.jit._pickle.build_tensorlist & co., which weights-only loading refuses.
    const auto list = value.toList();
    c10::impl::GenericList out(c10::AnyType::get());
    for (const c10::IValue& element : list.vec()) out.push_back(portable(element, storages));
    return out;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> elements;
    for (const auto& element : value.toTupleRef().elements()) elements.push_back(portable(element, storages));
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
  std::unordered_map<const void*, c10::ScalarType> storages;
  pickler.pushIValue(portable(state.to_ivalue(), storages));
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
// loads silently (its zip reader skips the CRC-32); its unpickler cannot read Python's OrderedDict
// (every module's state_dict) and knows no Python class. The reader below checks the zip, the pickle
// and the tensors itself, so that such a file is a CheckpointError, never a crash or a wrong tensor,
// and reads the pickle itself (LibTorch reads the zip): a dry run first (PickleCheck), then the values
// (PickleReader), never running anything the pickle names.
namespace {
static_assert(std::endian::native == std::endian::little, "the zip and pickle readers below read little-endian");

constexpr std::size_t kSmallestZip = 22;    // an empty zip is its end-of-central-directory record alone
constexpr std::size_t kMaxNesting = 1000;   // containers within containers; IValues are freed recursively

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
  [[noreturn]] void unreadable(const std::string& problem) const {
    throw CheckpointError("fulgur: " + what + " holds " + problem +
                          ". Save it in Python with that part converted to dictionaries, lists, tensors, numbers or "
                          "strings.");
  }
  /// Python objects (class, where) in a load that refuses them.
  [[noreturn]] void python_objects(const std::vector<std::pair<std::string, std::string>>& objects) const {
    std::string list;
    const std::size_t shown = std::min<std::size_t>(objects.size(), 6);
    for (std::size_t i = 0; i < shown; ++i)
      list += (i ? ", " : "") + objects[i].first +
              (objects[i].second.empty() ? " (the whole file)" : " at " + objects[i].second);
    if (objects.size() > shown) list += ", and " + std::to_string(objects.size() - shown) + " more";
    throw CheckpointError(
        "fulgur: " + what + " holds pickled Python objects, which have no C++ form: " + list +
        ". fulgur never runs anything a checkpoint names; to read it with each such object as a dictionary of "
        "its class and pickled contents ({\"__python__\": \"module.Class\", \"args\": ..., \"state\": ...}), pass "
        "fulgur::checkpoint::LoadOptions{.python_objects = fulgur::checkpoint::PythonObjects::as_dicts} (a "
        "Lightning checkpoint's hyperparameters or callback states; its weights are plain tensors either way).");
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

/// The globals a checkpoint's pickle names, by what reading them does. Python's torch.save and
/// LibTorch's pickler write the known ones; any other is a Python class or function (Object).
enum class GlobalKind : std::uint8_t {
  Tensor,          // torch._utils._rebuild_tensor_v2 (storage, offset, size, stride, requires_grad, hooks[, metadata])
  TensorV3,        // torch._utils._rebuild_tensor_v3 (..., hooks, dtype[, metadata]): dtypes without a typed storage
  QTensor,         // torch._utils._rebuild_qtensor (storage, offset, size, stride, qparams, requires_grad, hooks)
  TensorFromType,  // torch._tensor._rebuild_from_type_v2 (rebuild, class, args, state): a tensor with Python attributes
  Parameter,       // torch._utils._rebuild_parameter(_with_state) (tensor, requires_grad, hooks[, state])
  TypeTag,         // torch.jit._pickle.restore_type_tag, build_*list: LibTorch's typed containers
  Complex,         // builtins.complex (real, imag)
  Device,          // torch.device (type[, index])
  OrderedDict,     // collections.OrderedDict: a dictionary (every module's state_dict is one)
  Storage,         // torch.FloatStorage & co., torch.storage.UntypedStorage: a storage's element type
  Dtype,           // torch.float32 & co.: _rebuild_tensor_v3's element type
  QScheme,         // torch.per_tensor_affine & co.: _rebuild_qtensor's scheme
  Object,          // anything else
};

struct GlobalName {
  std::string qualified;  // "module.name", as Python 3 names it
  GlobalKind kind = GlobalKind::Object;
  c10::ScalarType type = c10::ScalarType::Undefined;  // of a Storage or a Dtype
  at::QScheme qscheme = at::kPerTensorAffine;         // of a QScheme
};

GlobalName classify(const std::string& module_name, const std::string& name) {
  static const auto storages = [] {
    std::unordered_map<std::string, c10::ScalarType> out;
    for (int i = 0; i < static_cast<int>(c10::ScalarType::NumOptions); ++i) {
      const auto type = static_cast<c10::ScalarType>(i);
      if (type != c10::ScalarType::Undefined) out.emplace(std::string(c10::toString(type)) + "Storage", type);
    }
    return out;
  }();
  // Protocol 2 writes Python 2's module names (fix_imports), which Python 3 reads as these.
  const std::string module = module_name == "__builtin__" ? "builtins" : module_name == "copy_reg" ? "copyreg" : module_name;
  GlobalName g{module + "." + name};
  const auto is = [&](GlobalKind kind) { g.kind = kind; };
  if (module == "torch._utils") {
    if (name == "_rebuild_tensor_v2") is(GlobalKind::Tensor);
    else if (name == "_rebuild_tensor_v3") is(GlobalKind::TensorV3);
    else if (name == "_rebuild_qtensor") is(GlobalKind::QTensor);
    else if (name == "_rebuild_parameter" || name == "_rebuild_parameter_with_state") is(GlobalKind::Parameter);
  } else if (module == "torch._tensor" && name == "_rebuild_from_type_v2") {
    is(GlobalKind::TensorFromType);
  } else if (module == "torch.jit._pickle" && (name == "restore_type_tag" || name == "build_intlist" ||
                                              name == "build_tensorlist" || name == "build_doublelist" ||
                                              name == "build_boollist")) {
    is(GlobalKind::TypeTag);
  } else if (module == "builtins" && name == "complex") {
    is(GlobalKind::Complex);
  } else if (module == "collections" && name == "OrderedDict") {
    is(GlobalKind::OrderedDict);
  } else if ((module == "torch.storage" || module == "torch") && name == "UntypedStorage") {
    is(GlobalKind::Storage), g.type = c10::ScalarType::Byte;
  } else if (module == "torch") {
    const auto& dtypes = c10::getStringToDtypeMap();
    if (name == "device") {
      is(GlobalKind::Device);
    } else if (const auto s = storages.find(name); s != storages.end()) {
      is(GlobalKind::Storage), g.type = s->second;
    } else if (const auto d = dtypes.find(name); d != dtypes.end()) {
      is(GlobalKind::Dtype), g.type = d->second;
    } else {
      for (int i = 0; i < at::COMPILE_TIME_NUM_QSCHEMES; ++i)
        if (name == c10::toString(static_cast<at::QScheme>(i))) is(GlobalKind::QScheme), g.qscheme = static_cast<at::QScheme>(i);
    }
  }
  return g;
}

/// A dry run of PickleReader (below) over the opcodes it reads, before it builds anything. Of each
/// value it keeps only what proves that building and freeing the result stays in bounds: which
/// container it is (to measure nesting and find a container that holds itself) and which global it
/// names. A Python object is a container too: its arguments, state and entries are what it holds.
class PickleCheck {
 public:
  PickleCheck(const unsigned char* data, std::size_t size) : data_(data), size_(size) {}

  /// "" when the pickle can be read safely, or what is wrong with it.
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
  enum class Shape : std::uint8_t { Plain, OrderedDict, Object };
  static constexpr std::uint32_t kNone = UINT32_MAX;
  struct Container {
    Slot first, second;  // of a tuple: restore_type_tag and build_*list return the first; a storage's
                         // second is its element type
    std::size_t size = 0;
    Shape shape = Shape::Plain;
    std::uint32_t items = kNone, list = kNone;  // an object's dictionary and list entries
  };

  [[noreturn]] void fail(const std::string& problem) const {
    throw "its data.pkl " + problem +
        (pos_ < size_ ? " (byte " + std::to_string(pos_) + " of " + std::to_string(size_) + ")" : std::string());
  }
  std::uint64_t read(int bytes) {
    if (!fits(pos_, static_cast<std::uint64_t>(bytes), size_)) fail("ends in the middle of an opcode");
    const std::uint64_t v = bytes == 0 ? 0 : le(data_ + pos_, bytes);
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
  Slot new_container(Shape shape = Shape::Plain) {
    if (containers_.size() >= kNone) fail("holds too many containers");
    containers_.push_back({});
    containers_.back().shape = shape;
    return {Kind::Container, static_cast<std::uint32_t>(containers_.size() - 1)};
  }
  /// Where SETITEMS and APPENDS put entries: the dict or list itself, or an object's "items" or "list".
  Slot entries_of(Slot target, bool list) {
    if (target.kind != Kind::Container) fail("adds items to something that is not a list or dictionary");
    if (containers_[target.index].shape != Shape::Object) return target;
    std::uint32_t sub = list ? containers_[target.index].list : containers_[target.index].items;
    if (sub == kNone) {
      sub = new_container().index;
      (list ? containers_[target.index].list : containers_[target.index].items) = sub;
      edges_.emplace_back(target.index, sub);
    }
    return {Kind::Container, sub};
  }
  /// The stack's values from `from` on go into `target` (a list, dict or tuple).
  void add(Slot target, std::size_t from) {
    if (target.kind != Kind::Container) fail("adds items to something that is not a list or dictionary");
    for (std::size_t i = from; i < stack_.size(); ++i)
      if (stack_[i].kind == Kind::Container) edges_.emplace_back(target.index, stack_[i].index);
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
  /// A Python object made from `argument` (its "args").
  Slot object(Slot argument) {
    const Slot o = new_container(Shape::Object);
    if (argument.kind == Kind::Container) edges_.emplace_back(o.index, argument.index);
    return o;
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
  void global() {
    const std::string module = line(), name = line();
    globals_.push_back(classify(module, name).kind);
    stack_.push_back({Kind::Global, static_cast<std::uint32_t>(globals_.size() - 1)});
  }
  void reduce() {  // function(*argument)
    need(2);
    const Slot function = stack_[stack_.size() - 2], argument = stack_.back();
    stack_.resize(stack_.size() - 2);
    if (function.kind != Kind::Global) fail("calls something that is not a global");
    switch (globals_[function.index]) {
      case GlobalKind::TypeTag:
        stack_.push_back(argument.kind == Kind::Container ? containers_[argument.index].first : Slot{});
        break;
      case GlobalKind::OrderedDict: stack_.push_back(new_container(Shape::OrderedDict)); break;
      case GlobalKind::Storage: case GlobalKind::Dtype: case GlobalKind::QScheme: case GlobalKind::Object:
        stack_.push_back(object(argument));
        break;
      default: stack_.push_back({}); break;  // a tensor, a complex number, a device
    }
  }
  void new_object() {  // NEWOBJ: cls.__new__(cls, *args)
    need(2);
    const Slot cls = stack_[stack_.size() - 2], args = stack_.back();
    stack_.resize(stack_.size() - 2);
    if (cls.kind != Kind::Global) fail("creates an instance of something that is not a class");
    stack_.push_back(globals_[cls.index] == GlobalKind::OrderedDict ? new_container(Shape::OrderedDict) : object(args));
  }
  void build() {  // BUILD: the object below gets the state on top
    need(2);
    const Slot target = stack_[stack_.size() - 2], state = stack_.back();
    stack_.pop_back();
    if (target.kind != Kind::Container || containers_[target.index].shape == Shape::Plain)
      fail("sets the state of something that is not a Python object");
    if (containers_[target.index].shape == Shape::Object && state.kind == Kind::Container)
      edges_.emplace_back(target.index, state.index);
  }
  void integer(std::int64_t v) { stack_.push_back({Kind::Int, 0, v}); }
  /// ('storage', element type, key, location, count) -> a storage. An element type given as a number
  /// must be one of c10::ScalarType's.
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
    if (id > size_) fail("writes a memo entry far beyond any pickler's numbering");  // the memo would be allocated up to it
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
        case 0x8a: {                                                               // LONG1
          const int n = static_cast<int>(read(1));
          if (n > 8) fail("holds an integer longer than 64 bits");
          std::uint64_t v = read(n);
          if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~std::uint64_t{0} << (8 * n);
          integer(static_cast<std::int64_t>(v));
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
          add(entries_of(stack_[stack_.size() - 2], true), stack_.size() - 1);
          stack_.pop_back();
        } break;
        case 'e': {                                                                // APPENDS
          const std::size_t start = pop_mark();
          if (start == 0) fail("appends to nothing");
          add(entries_of(stack_[start - 1], true), start);
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
          const Slot dict = op == 'd' ? new_container() : entries_of(stack_[start - 1], false);
          add(dict, start);
          stack_.resize(start);
          if (op == 'd') stack_.push_back(dict);
        } break;
        case 's': {                                                                // SETITEM
          need(3);
          add(entries_of(stack_[stack_.size() - 3], false), stack_.size() - 2);
          stack_.resize(stack_.size() - 2);
        } break;
        case 'h': memo_get(read(1)); break;                                        // BINGET
        case 'j': memo_get(read(4)); break;                                        // LONG_BINGET
        case 'q': memo_put(read(1)); break;                                        // BINPUT
        case 'r': memo_put(read(4)); break;                                        // LONG_BINPUT
        case 'c': global(); break;                                                 // GLOBAL
        case 0x81: new_object(); break;                                            // NEWOBJ
        case 'R': reduce(); break;                                                 // REDUCE
        case 'b': build(); break;                                                  // BUILD
        case 'Q': storage(); break;                                                // BINPERSID
        case '.': return;                                                          // STOP
        default: {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", op);
          --pos_;
          fail(std::string("holds opcode ") + hex + ", which torch.save does not write (protocol 2)");
        }
      }
    }
  }

  /// Containers are freed recursively (and one that holds itself never): bound the depth of every
  /// container this pickle builds, reachable from the result or not.
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
  std::vector<GlobalKind> globals_;
  std::vector<Container> containers_;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> edges_;  // container -> container it holds
};

/// What a checkpoint holds that fulgur reads but has no use for: a dictionary keyed by a Python
/// object, a quantization scheme it cannot rebuild. Not corruption: the file is as it was written.
struct Unreadable {
  std::string problem;
};

/// "'a'['b'][3]": where a value is, for messages.
std::string child_path(const std::string& where, const c10::IValue& key) {
  if (key.isString()) return where.empty() ? "'" + key.toStringRef() + "'" : where + "['" + key.toStringRef() + "']";
  if (key.isInt()) return where + "[" + std::to_string(key.toInt()) + "]";
  return where + "[?]";
}

/// Builds what a pickle that PickleCheck passed stands for, as Python's unpickler would, without
/// running anything: dicts (an OrderedDict too, its attributes dropped), lists, tuples, numbers,
/// strings, complex numbers, devices, and tensors over the archive's records (a tensor subclass or a
/// Parameter as the plain tensor). Any other global becomes a dictionary that names it
/// ({"__python__": "module.name"}), and a call of it, an object: that dictionary with its "args", then
/// its "state", "items" and "list" as the pickle gives them (PythonObjects::as_dicts).
class PickleReader {
 public:
  /// The record "data/<key>" of the archive: its bytes and their count.
  using RecordReader = std::function<std::pair<at::DataPtr, std::size_t>(const std::string& key)>;
  /// Checks a tensor against its storage before it is used, not only once the pickle is read.
  using TensorCheck = std::function<void(const at::Tensor& tensor, const std::string& what)>;

  PickleReader(const unsigned char* data, std::size_t size, RecordReader read_record, TensorCheck check)
      : data_(data), size_(size), read_record_(std::move(read_record)), check_(std::move(check)) {}

  c10::IValue read() {
    pos_ = 2;  // PickleCheck has seen the protocol
    for (;;) {
      if (pos_ >= size_) fail("ends before its STOP opcode");
      const unsigned char op = data_[pos_++];
      switch (op) {
        case '(': marks_.push_back(stack_.size()); break;
        case ')': stack_.emplace_back(c10::ivalue::Tuple::create(std::vector<c10::IValue>{})); break;
        case 'N': stack_.emplace_back(); break;
        case 0x88: stack_.emplace_back(true); break;
        case 0x89: stack_.emplace_back(false); break;
        case 'K': stack_.emplace_back(static_cast<std::int64_t>(read_le(1))); break;
        case 'M': stack_.emplace_back(static_cast<std::int64_t>(read_le(2))); break;
        case 'J': stack_.emplace_back(static_cast<std::int64_t>(static_cast<std::int32_t>(read_le(4)))); break;
        case 'G': {  // big-endian
          const std::uint64_t bits = __builtin_bswap64(read_le(8));
          double v;
          std::memcpy(&v, &bits, sizeof v);
          stack_.emplace_back(v);
        } break;
        case 0x8a: {  // little-endian two's complement, 0 to 8 bytes
          const int n = static_cast<int>(read_le(1));
          if (n > 8) fail("holds an integer longer than 64 bits");
          std::uint64_t v = read_le(n);
          if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~std::uint64_t{0} << (8 * n);
          stack_.emplace_back(static_cast<std::int64_t>(v));
        } break;
        case 'X': stack_.emplace_back(text(read_le(4))); break;
        case 0x8d: stack_.emplace_back(text(read_le(8))); break;
        case ']': stack_.emplace_back(c10::impl::GenericList(c10::AnyType::get())); break;
        case '}': stack_.emplace_back(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get())); break;
        case 0x85: case 0x86: case 0x87: {
          const std::size_t n = op - 0x84u;
          need(n);
          tuple(stack_.size() - n);
        } break;
        case 't': tuple(pop_mark()); break;
        case 'a': {
          need(2);
          append(stack_[stack_.size() - 2], stack_.size() - 1);
          stack_.pop_back();
        } break;
        case 'e': {
          const std::size_t start = pop_mark();
          if (start == 0) fail("appends to nothing");
          append(stack_[start - 1], start);
          stack_.resize(start);
        } break;
        case 'l': {
          const std::size_t start = pop_mark();
          c10::IValue list = c10::impl::GenericList(c10::AnyType::get());
          append(list, start);
          stack_.resize(start);
          stack_.push_back(std::move(list));
        } break;
        case 'd': {
          const std::size_t start = pop_mark();
          c10::IValue dict = c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get());
          set_items(dict, start);
          stack_.resize(start);
          stack_.push_back(std::move(dict));
        } break;
        case 'u': {
          const std::size_t start = pop_mark();
          if (start == 0) fail("sets items of nothing");
          set_items(stack_[start - 1], start);
          stack_.resize(start);
        } break;
        case 's': {
          need(3);
          set_items(stack_[stack_.size() - 3], stack_.size() - 2);
          stack_.resize(stack_.size() - 2);
        } break;
        case 'h': memo_get(read_le(1)); break;
        case 'j': memo_get(read_le(4)); break;
        case 'q': memo_put(read_le(1)); break;
        case 'r': memo_put(read_le(4)); break;
        case 'c': global(); break;
        case 0x81: new_object(); break;
        case 'R': reduce(); break;
        case 'b': build(); break;
        case 'Q': persistent_id(); break;
        case '.':
          if (stack_.size() != 1) fail("ends with " + std::to_string(stack_.size()) + " values instead of one");
          return stack_.back();
        default: {
          --pos_;
          fail("holds an opcode fulgur does not read");
        }
      }
    }
  }

  /// The Python objects (and references to Python classes or functions) that `value` holds: the
  /// name of each and where it is ("" for the whole value), in the order a walk of it meets them.
  std::vector<std::pair<std::string, std::string>> python_objects(const c10::IValue& value) const {
    std::vector<std::pair<std::string, std::string>> found;
    std::unordered_set<const void*> seen;
    find_objects(value, "", seen, found);
    return found;
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const {
    throw "its data.pkl " + problem +
        (pos_ < size_ ? " (byte " + std::to_string(pos_) + " of " + std::to_string(size_) + ")" : std::string());
  }
  std::uint64_t read_le(int bytes) {
    if (!fits(pos_, static_cast<std::uint64_t>(bytes), size_)) fail("ends in the middle of an opcode");
    const std::uint64_t v = bytes == 0 ? 0 : le(data_ + pos_, bytes);
    pos_ += static_cast<std::size_t>(bytes);
    return v;
  }
  std::string text(std::uint64_t n) {
    if (!fits(pos_, n, size_)) fail("holds a string longer than the rest of the file");
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  std::string line() {
    const std::size_t start = pos_;
    while (pos_ < size_ && data_[pos_] != '\n') ++pos_;
    if (pos_ == size_) fail("names a global that is not a Python identifier");
    return std::string(reinterpret_cast<const char*>(data_ + start), pos_++ - start);
  }
  void need(std::size_t n) const {
    if (stack_.size() < n) fail("takes more values than its stack holds");
  }
  c10::IValue pop() {
    need(1);
    c10::IValue v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }
  std::size_t pop_mark() {
    if (marks_.empty() || marks_.back() > stack_.size()) fail("has a MARK that does not match");
    const std::size_t start = marks_.back();
    marks_.pop_back();
    return start;
  }
  void tuple(std::size_t from) {
    std::vector<c10::IValue> elements(std::make_move_iterator(stack_.begin() + static_cast<std::ptrdiff_t>(from)),
                                      std::make_move_iterator(stack_.end()));
    stack_.resize(from);
    stack_.emplace_back(c10::ivalue::Tuple::create(std::move(elements)));
  }
  void memo_get(std::uint64_t id) {
    if (id >= memo_.size()) fail("reads a memo entry it never wrote");
    stack_.push_back(memo_[id]);
  }
  void memo_put(std::uint64_t id) {
    need(1);
    if (id > size_) fail("writes a memo entry far beyond any pickler's numbering");
    if (id >= memo_.size()) memo_.resize(id + 1);
    memo_[id] = stack_.back();
  }

  /// A dictionary that stands for a Python global, or an object of it, kept alive (its address is
  /// its identity) until the reader is done.
  c10::IValue named(const std::string& qualified) {
    c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
    d.insert(std::string("__python__"), qualified);
    made_.emplace_back(std::move(d));
    return made_.back();
  }
  const GlobalName* global_of(const c10::IValue& v) const {
    if (!v.isGenericDict()) return nullptr;
    const auto it = globals_.find(v.internalToPointer());
    return it == globals_.end() ? nullptr : &it->second;
  }
  bool is_object(const c10::IValue& v) const { return v.isGenericDict() && objects_.count(v.internalToPointer()) > 0; }

  void global() {
    const std::string module = line(), name = line();
    GlobalName g = classify(module, name);
    c10::IValue marker = named(g.qualified);
    globals_.emplace(marker.internalToPointer(), std::move(g));
    stack_.push_back(std::move(marker));
  }
  c10::IValue object(const std::string& qualified, c10::IValue args) {
    c10::IValue o = named(qualified);
    o.toGenericDict().insert(std::string("args"), std::move(args));
    objects_.emplace(o.internalToPointer(), qualified);
    return o;
  }
  c10::IValue ordered_dict() {
    made_.emplace_back(c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
    ordered_dicts_.insert(made_.back().internalToPointer());
    return made_.back();
  }
  /// An object's "items" or "list": where SETITEMS and APPENDS put a dict or list subclass's entries.
  c10::IValue entries_of(const c10::IValue& o, bool list) {
    auto d = o.toGenericDict();
    const std::string key = list ? "list" : "items";
    if (!d.contains(key)) {
      if (list) d.insert(key, c10::impl::GenericList(c10::AnyType::get()));
      else d.insert(key, c10::impl::GenericDict(c10::AnyType::get(), c10::AnyType::get()));
    }
    return d.at(key);
  }

  /// What a C++ dictionary can hold as a key: Python's hashable values that have a C++ form.
  static bool usable_key(const c10::IValue& k) {
    if (k.isNone() || k.isBool() || k.isInt() || k.isDouble() || k.isString() || k.isTensor() || k.isDevice()) return true;
    if (!k.isTuple()) return false;
    const auto& elements = k.toTupleRef().elements();
    return std::all_of(elements.begin(), elements.end(), usable_key);
  }
  void set_items(c10::IValue target, std::size_t from) {
    if ((stack_.size() - from) % 2 != 0) fail("holds a key without a value");
    if (is_object(target)) target = entries_of(target, false);
    if (!target.isGenericDict() || global_of(target) != nullptr) fail("sets items of something that is not a dictionary");
    auto dict = target.toGenericDict();
    for (std::size_t i = from; i < stack_.size(); i += 2) {
      if (!usable_key(stack_[i])) {
        const GlobalName* g = global_of(stack_[i]);
        const auto o = stack_[i].isGenericDict() ? objects_.find(stack_[i].internalToPointer()) : objects_.end();
        throw Unreadable{"a dictionary keyed by " +
                         (g ? "the Python global " + g->qualified
                            : o != objects_.end() ? "Python objects (" + o->second + ")"
                                                  : std::string("values of kind ") + stack_[i].tagKind()) +
                         ", which a C++ dictionary cannot hold as keys"};
      }
      dict.insert_or_assign(stack_[i], stack_[i + 1]);
    }
  }
  void append(c10::IValue target, std::size_t from) {
    if (is_object(target)) target = entries_of(target, true);
    if (!target.isList()) fail("appends to something that is not a list");
    auto list = target.toList();
    for (std::size_t i = from; i < stack_.size(); ++i) list.push_back(stack_[i]);
  }

  void reduce() {
    c10::IValue argument = pop(), function = pop();
    const GlobalName* g = global_of(function);
    if (g == nullptr) fail("calls something that is not a global");
    const auto elements = [&](std::size_t least, const char* what) -> c10::ArrayRef<c10::IValue> {
      if (!argument.isTuple() || argument.toTupleRef().elements().size() < least) fail(what);
      return argument.toTupleRef().elements().asArrayRef();
    };
    switch (g->kind) {
      case GlobalKind::Tensor: case GlobalKind::TensorV3: case GlobalKind::QTensor:
        stack_.emplace_back(tensor(g->kind, argument));
        break;
      case GlobalKind::TensorFromType: {  // (rebuild, class, args, state): the tensor, without its class and attributes
        const auto e = elements(3, "holds a tensor subclass that cannot be rebuilt");
        const GlobalName* rebuild = global_of(e[0]);
        if (rebuild == nullptr || !(rebuild->kind == GlobalKind::Tensor || rebuild->kind == GlobalKind::TensorV3 ||
                                    rebuild->kind == GlobalKind::QTensor))
          fail("holds a tensor subclass that cannot be rebuilt");
        stack_.emplace_back(tensor(rebuild->kind, e[2]));
      } break;
      case GlobalKind::Parameter: {
        const auto e = elements(1, "rebuilds a Parameter from nothing");
        if (!e[0].isTensor()) fail("rebuilds a Parameter from something that is not a tensor");
        stack_.push_back(e[0]);
      } break;
      case GlobalKind::TypeTag: stack_.push_back(elements(1, "tags the type of nothing")[0]); break;
      case GlobalKind::Complex: {
        const auto e = elements(2, "holds a complex number without its two parts");
        if (!(e[0].isDouble() || e[0].isInt()) || !(e[1].isDouble() || e[1].isInt()))
          fail("holds a complex number whose parts are not numbers");
        stack_.emplace_back(c10::complex<double>(e[0].isInt() ? static_cast<double>(e[0].toInt()) : e[0].toDouble(),
                                                 e[1].isInt() ? static_cast<double>(e[1].toInt()) : e[1].toDouble()));
      } break;
      case GlobalKind::Device: {
        const auto e = elements(1, "holds a device without its type");
        if (!e[0].isString()) fail("holds a device whose type is not a string");
        c10::Device device(e[0].toStringRef());
        if (e.size() > 1 && !e[1].isNone()) {
          if (!e[1].isInt() || e[1].toInt() < 0 || e[1].toInt() > std::numeric_limits<c10::DeviceIndex>::max())
            fail("holds a device whose index is not one");
          device = c10::Device(device.type(), static_cast<c10::DeviceIndex>(e[1].toInt()));
        }
        stack_.emplace_back(device);
      } break;
      case GlobalKind::OrderedDict: stack_.push_back(ordered_dict()); break;  // OrderedDict(): its items follow
      default: stack_.push_back(object(g->qualified, std::move(argument))); break;
    }
  }
  void new_object() {  // NEWOBJ: cls.__new__(cls, *args)
    c10::IValue args = pop(), cls = pop();
    const GlobalName* g = global_of(cls);
    if (g == nullptr) fail("creates an instance of something that is not a class");
    stack_.push_back(g->kind == GlobalKind::OrderedDict ? ordered_dict() : object(g->qualified, std::move(args)));
  }
  void build() {  // BUILD: the object below gets the state on top
    c10::IValue state = pop();
    need(1);
    const c10::IValue& target = stack_.back();
    if (is_object(target)) target.toGenericDict().insert_or_assign(std::string("state"), std::move(state));
    else if (!target.isGenericDict() || ordered_dicts_.count(target.internalToPointer()) == 0)
      fail("sets the state of something that is not a Python object");
    // An OrderedDict's state is its attributes: a state_dict's _metadata (module versions), not needed here.
  }

  /// BINPERSID ('storage', element type, key, location, count): a byte tensor over the record
  /// data/<key> (each record read once, however many storages name it), its element type kept aside.
  void persistent_id() {
    const c10::IValue id = pop();
    if (!id.isTuple() || id.toTupleRef().elements().size() < 5) fail("holds a persistent id that is not a storage");
    const auto e = id.toTupleRef().elements().asArrayRef();
    if (!e[0].isString() || e[0].toStringRef() != "storage" || !e[2].isString() || !e[3].isString() || !e[4].isInt())
      fail("holds a persistent id that is not a storage");
    c10::ScalarType type = c10::ScalarType::Undefined;
    if (const GlobalName* g = global_of(e[1]); g != nullptr && g->kind == GlobalKind::Storage) type = g->type;
    else if (e[1].isInt() && e[1].toInt() >= 0 && e[1].toInt() < static_cast<std::int64_t>(c10::ScalarType::Undefined))
      type = static_cast<c10::ScalarType>(e[1].toInt());
    else fail("holds a storage of unknown element type");
    const std::int64_t count = e[4].toInt();
    const auto item = static_cast<std::int64_t>(c10::elementSize(type));
    if (count < 0 || count > (std::int64_t{1} << 62) / item) fail("holds a storage of " + std::to_string(count) + " elements");
    const auto bytes = static_cast<std::size_t>(count * item);
    at::Storage storage(c10::Storage::use_byte_size_t(), 0, at::DataPtr(), /*allocator=*/nullptr, /*resizable=*/false);
    if (bytes > 0) {
      const std::string& key = e[2].toStringRef();
      auto record = records_.find(key);
      if (record == records_.end()) {
        auto [data, size] = read_record_(key);
        record = records_.emplace(key, std::make_pair(std::make_shared<at::DataPtr>(std::move(data)), size)).first;
      }
      const auto& [data, size] = record->second;
      if (size < bytes)
        fail("holds a storage of " + std::to_string(count) + " " + c10::toString(type) + " elements (" +
             std::to_string(bytes) + " bytes) in record 'data/" + key + "', which holds " + std::to_string(size) + " bytes");
      // One storage per size a record is read as (Python's typed storages of one key share it), each
      // over the record's bytes, which stay alive while any of them does.
      auto& shared = storages_[key + "/" + std::to_string(bytes)];
      if (!shared) {
        void* bytes_at = data->get();
        at::DataPtr view(bytes_at, new std::shared_ptr<at::DataPtr>(data),
                         [](void* owner) { delete static_cast<std::shared_ptr<at::DataPtr>*>(owner); }, at::Device(at::kCPU));
        shared = at::Storage(c10::Storage::use_byte_size_t(), bytes, std::move(view), /*allocator=*/nullptr, /*resizable=*/false);
      }
      storage = shared;
    }
    at::Tensor t = at::empty({0}, at::kByte);
    t.set_(storage, 0, {static_cast<std::int64_t>(bytes)}, {1});
    storage_types_.emplace(t.unsafeGetTensorImpl(), type);
    made_.emplace_back(t);
    stack_.emplace_back(std::move(t));
  }

  std::vector<std::int64_t> integers(const c10::IValue& v) const {
    if (!v.isTuple()) fail("holds a tensor whose size or stride is not a tuple of integers");
    std::vector<std::int64_t> out;
    for (const c10::IValue& e : v.toTupleRef().elements()) {
      if (!e.isInt()) fail("holds a tensor whose size or stride is not a tuple of integers");
      out.push_back(e.toInt());
    }
    return out;
  }
  /// A quantized tensor's empty shell, from _rebuild_qtensor's qparams.
  at::Tensor quantized(c10::ScalarType type, const c10::IValue& qparams, const std::vector<std::int64_t>& sizes) {
    if (!qparams.isTuple() || qparams.toTupleRef().elements().empty()) fail("holds quantization parameters that are not a tuple");
    const auto q = qparams.toTupleRef().elements().asArrayRef();
    at::QScheme scheme;
    if (const GlobalName* g = global_of(q[0]); g != nullptr && g->kind == GlobalKind::QScheme) scheme = g->qscheme;
    else if (q[0].isInt() && q[0].toInt() >= 0 && q[0].toInt() < at::COMPILE_TIME_NUM_QSCHEMES)
      scheme = static_cast<at::QScheme>(q[0].toInt());
    else fail("holds a quantized tensor of unknown scheme");
    const auto options = at::TensorOptions().dtype(type);
    if (scheme == at::kPerTensorAffine) {
      if (q.size() < 3 || !(q[1].isDouble() || q[1].isInt()) || !q[2].isInt()) fail("holds malformed quantization parameters");
      return at::_empty_affine_quantized({0}, options, q[1].isInt() ? static_cast<double>(q[1].toInt()) : q[1].toDouble(),
                                         q[2].toInt());
    }
    if (scheme == at::kPerChannelAffine || scheme == at::kPerChannelAffineFloatQParams) {
      if (q.size() < 4 || !q[1].isTensor() || !q[2].isTensor() || !q[3].isInt()) fail("holds malformed quantization parameters");
      const at::Tensor& scales = q[1].toTensor();
      const at::Tensor& zero_points = q[2].toTensor();
      const std::int64_t axis = q[3].toInt();
      check_(scales, "a quantized tensor's scales");
      check_(zero_points, "a quantized tensor's zero points");
      const bool axis_in_range = axis >= 0 && axis < static_cast<std::int64_t>(sizes.size());
      if (!axis_in_range || scales.dim() != 1 || zero_points.dim() != 1 ||
          scales.numel() != sizes[static_cast<std::size_t>(axis)] ||
          zero_points.numel() != sizes[static_cast<std::size_t>(axis)])
        fail("holds per-channel quantization parameters that do not match the tensor's shape");
      return at::_empty_per_channel_affine_quantized({0}, scales, zero_points, axis, options);
    }
    throw Unreadable{"a quantized tensor of scheme " + c10::toString(scheme) + ", which fulgur cannot rebuild"};
  }
  /// _rebuild_tensor_v2 / _v3 / _rebuild_qtensor: a view of a storage. Its bounds against the storage
  /// are check_tensors' (that message names the tensor); here, what the view is made of.
  at::Tensor tensor(GlobalKind kind, const c10::IValue& args) {
    if (!args.isTuple()) fail("rebuilds a tensor from something that is not a tuple");
    const auto e = args.toTupleRef().elements().asArrayRef();
    const std::size_t least = kind == GlobalKind::Tensor ? 6 : 7, most = kind == GlobalKind::QTensor ? 7 : least + 1;
    if (e.size() < least || e.size() > most) fail("rebuilds a tensor from " + std::to_string(e.size()) + " arguments");
    const auto storage_type =
        e[0].isTensor() ? storage_types_.find(e[0].toTensor().unsafeGetTensorImpl()) : storage_types_.end();
    if (storage_type == storage_types_.end()) fail("rebuilds a tensor from something that is not a storage");
    c10::ScalarType type = storage_type->second;
    if (kind == GlobalKind::TensorV3) {
      const GlobalName* dtype = global_of(e[6]);
      if (dtype == nullptr || dtype->kind != GlobalKind::Dtype) fail("rebuilds a tensor of an unknown dtype");
      type = dtype->type;
    }
    if (!e[1].isInt()) fail("holds a tensor whose offset is not an integer");
    const std::int64_t offset = e[1].toInt();
    const std::vector<std::int64_t> sizes = integers(e[2]), strides = integers(e[3]);
    if (sizes.size() != strides.size())
      fail("holds a tensor with " + std::to_string(sizes.size()) + " sizes and " + std::to_string(strides.size()) + " strides");
    constexpr std::int64_t kLimit = std::int64_t{1} << 62;  // no product of two such numbers overflows wide_int
    if (offset < 0 || offset > kLimit) fail("holds a tensor whose storage offset is " + std::to_string(offset));
    wide_int elements = 1;
    for (std::size_t d = 0; d < sizes.size(); ++d) {
      if (sizes[d] < 0 || strides[d] < -kLimit || strides[d] > kLimit) fail("holds a tensor of shape " + c10::str(c10::IntArrayRef(sizes)) + ", strides " +
                                                                            c10::str(c10::IntArrayRef(strides)));
      if (sizes[d] > 0) elements *= sizes[d];
      if (elements > kLimit) fail("holds a tensor of shape " + c10::str(c10::IntArrayRef(sizes)) + ", more elements than any storage holds");
    }
    at::Tensor result;
    if (kind == GlobalKind::QTensor) {
      if (!c10::isQIntType(type)) fail("holds quantization parameters for a tensor of element type " + std::string(c10::toString(type)));
      result = quantized(type, e[4], sizes);
    } else {
      if (c10::isQIntType(type)) fail("holds a tensor that is quantized but has no quantization parameters");
      result = at::empty({0}, at::TensorOptions().dtype(type));
    }
    at::TensorImpl* impl = result.unsafeGetTensorImpl();
    impl->set_storage_keep_dtype(e[0].toTensor().storage());
    impl->set_storage_offset(offset);
    impl->set_sizes_and_strides(sizes, strides);
    const std::size_t metadata = kind == GlobalKind::Tensor ? 6 : 7;  // the conjugate and negative bits
    if (kind != GlobalKind::QTensor && e.size() > metadata && !e[metadata].isNone()) {
      if (!e[metadata].isGenericDict()) fail("holds a tensor whose metadata is not a dictionary");
      for (const auto& item : e[metadata].toGenericDict()) {
        if (!item.key().isString() || !item.value().isBool() || !item.value().toBool()) continue;
        const std::string& bit = item.key().toStringRef();
        if ((bit == "conj" || bit == "neg") && !c10::isComplexType(type))
          fail("holds a tensor of element type " + std::string(c10::toString(type)) + " marked as " + bit);
        if (bit == "conj") result._set_conj(true);
        if (bit == "neg") result._set_neg(true);
      }
    }
    return result;
  }

  void find_objects(const c10::IValue& v, const std::string& where, std::unordered_set<const void*>& seen,
                    std::vector<std::pair<std::string, std::string>>& found) const {
    if (v.isGenericDict()) {
      const void* p = v.internalToPointer();
      if (const auto o = objects_.find(p); o != objects_.end()) return found.emplace_back(o->second, where), void();
      if (const auto g = globals_.find(p); g != globals_.end()) return found.emplace_back(g->second.qualified, where), void();
    }
    if (!(v.isGenericDict() || v.isList() || v.isTuple()) || !seen.insert(v.internalToPointer()).second) return;
    if (v.isGenericDict()) {
      for (const auto& item : v.toGenericDict()) {
        find_objects(item.key(), where + "[key]", seen, found);
        find_objects(item.value(), child_path(where, item.key()), seen, found);
      }
    } else if (v.isList()) {
      const auto list = v.toListRef();
      for (std::size_t i = 0; i < list.size(); ++i) find_objects(list[i], where + "[" + std::to_string(i) + "]", seen, found);
    } else {
      const auto& elements = v.toTupleRef().elements();
      for (std::size_t i = 0; i < elements.size(); ++i)
        find_objects(elements[i], where + "[" + std::to_string(i) + "]", seen, found);
    }
  }

  const unsigned char* data_;
  std::size_t size_;
  std::size_t pos_ = 0;
  RecordReader read_record_;
  TensorCheck check_;
  std::vector<c10::IValue> stack_;
  std::vector<std::size_t> marks_;
  std::vector<c10::IValue> memo_;
  std::vector<c10::IValue> made_;  // what the maps below point to, alive until the reader is done
  std::unordered_map<const void*, GlobalName> globals_;
  std::unordered_map<const void*, std::string> objects_;
  std::unordered_set<const void*> ordered_dicts_;
  std::unordered_map<const void*, c10::ScalarType> storage_types_;  // of the byte tensors over storages
  std::unordered_map<std::string, std::pair<std::shared_ptr<at::DataPtr>, std::size_t>> records_;  // by key
  std::unordered_map<std::string, at::Storage> storages_;  // by "<key>/<bytes>"
};

/// A tensor's elements lie within its storage and its storage within the record it was read from
/// (a storage is sized by the pickle's element count; sizes, strides and offsets are as given).
void check_tensor(const at::Tensor& t, const std::string& where,
                  const std::unordered_map<const void*, std::size_t>& record_sizes, const Complaint& complain) {
  if (!t.defined() || t.is_meta()) return;
  if (t.layout() != c10::kStrided || !t.is_cpu()) complain.corrupt("tensor " + where + " is not a dense CPU tensor");
  const std::size_t bytes = t.storage().nbytes();
  const auto record = record_sizes.find(t.storage().data());
  if (bytes > 0 && (record == record_sizes.end() || record->second < bytes))
    complain.corrupt("the storage of tensor " + where + " claims " + std::to_string(bytes) +
                     " bytes, more than its record holds");
  if (t.numel() == 0) return;
  wide_int last = t.storage_offset();
  bool negative = last < 0;
  for (std::int64_t d = 0; d < t.dim(); ++d) {
    negative = negative || t.stride(d) < 0;
    last += static_cast<wide_int>(t.size(d) - 1) * t.stride(d);
  }
  const std::string view = "tensor " + where + " (shape " + c10::str(t.sizes()) + ", strides " +
                           c10::str(t.strides()) + ", offset " + std::to_string(t.storage_offset()) + ")";
  if (negative) complain.corrupt(view + " has a negative stride or offset");
  if ((last + 1) * t.element_size() > static_cast<wide_int>(bytes))
    complain.corrupt(view + " reaches past its storage of " + std::to_string(bytes) + " bytes");
}

/// check_tensor of every tensor `value` holds.
void check_tensors(const c10::IValue& value, const std::string& where,
                   const std::unordered_map<const void*, std::size_t>& record_sizes,
                   std::unordered_set<const void*>& seen, const Complaint& complain) {
  if (value.isTensor()) return check_tensor(value.toTensor(), where, record_sizes, complain);
  if (!(value.isGenericDict() || value.isList() || value.isTuple())) return;
  if (!seen.insert(value.internalToPointer()).second) return;
  if (value.isGenericDict()) {
    for (const auto& item : value.toGenericDict()) {
      check_tensors(item.key(), where + "[key]", record_sizes, seen, complain);
      check_tensors(item.value(), child_path(where, item.key()), record_sizes, seen, complain);
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


StateDict from_memory(const char* data, std::size_t size, const std::string& what, const LoadOptions& options) {
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
  std::vector<std::pair<std::string, std::string>> objects;  // Python objects: class, where
  std::unordered_map<const void*, std::size_t> record_sizes;
  try {
    caffe2::serialize::PyTorchStreamReader archive(std::make_shared<MemoryReader>(data, size));
    const auto pickle = archive.getRecord("data.pkl");
    const auto* pickled = static_cast<const unsigned char*>(std::get<0>(pickle).get());
    const std::size_t pickle_size = std::get<1>(pickle);
    if (const std::string problem = PickleCheck(pickled, pickle_size).problem(); !problem.empty()) complain.corrupt(problem);
    auto read_record = [&](const std::string& key) {
      auto [record, record_size] = archive.getRecord("data/" + key);
      record_sizes[record.get()] = record_size;
      return std::pair<at::DataPtr, std::size_t>(std::move(record), record_size);
    };
    auto check = [&](const at::Tensor& t, const std::string& where) { check_tensor(t, where, record_sizes, complain); };
    // Tensors load on the CPU, as Lightning's map_location puts them.
    PickleReader reader(pickled, pickle_size, read_record, check);
    value = reader.read();
    objects = reader.python_objects(value);
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::string& problem) {
    complain.corrupt(problem);
  } catch (const Unreadable& u) {
    complain.unreadable(u.problem);
  } catch (const std::exception& e) {  // c10::Error, std::bad_alloc, ...
    complain.corrupt("LibTorch cannot read it (" + detail::first_line(e.what()) + ")");
  }
  std::unordered_set<const void*> seen;
  check_tensors(value, "", record_sizes, seen, complain);
  // A file that is a Python object is a dictionary here: the one that stands for it (as_dicts).
  if (!value.isGenericDict())
    complain.not_a_checkpoint("it holds a " + std::string(value.tagKind()) + ", not a dictionary");
  for (const auto& item : value.toGenericDict())
    if (!item.key().isString()) complain.not_a_checkpoint("it has a non-string key at its top level");
  if (!objects.empty() && options.python_objects == PythonObjects::refuse) complain.python_objects(objects);
  StateDict out;
  for (const auto& item : value.toGenericDict()) out.insert(item.key().toStringRef(), item.value());
  return out;
}
}  // namespace

StateDict from_bytes(const std::vector<char>& bytes, const std::string& what, const LoadOptions& options) {
  return from_memory(bytes.data(), bytes.size(), what, options);
}

void save(const std::string& path, const StateDict& state) { atomic_write(path, to_bytes(state)); }

void remove(const std::string& path) {
  ::unlink(path.c_str());
  detail::remove_tree(path + ".shards");  // a sharded checkpoint's shard files (ShardedStrategy)
}

StateDict load(const std::string& path, const LoadOptions& options) {
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
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_size = ::sysconf(_SC_PAGE_SIZE);  // -1 if unknown
  const std::uint64_t memory = pages > 0 && page_size > 0
                                   ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page_size)
                                   : std::numeric_limits<std::uint64_t>::max();
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
  StateDict state = from_memory(bytes.data(), bytes.size(), "checkpoint '" + path + "'", options);
  distributed::resolve_shard_files(state, detail::parent_folder(path));
  return state;
}

void consolidate(const std::string& sharded, const std::string& out) {
  const StateDict checkpoint = load(sharded);  // the rank files' names made paths
  std::function<c10::IValue(const c10::IValue&)> joined = [&](const c10::IValue& value) -> c10::IValue {
    if (value.isGenericDict()) {
      const StateDict dict(value.toGenericDict());
      if (distributed::is_sharded_module_state(dict)) return distributed::consolidate_module_state(dict).to_ivalue();
      const bool optimizer = dict.contains("format") && dict.at("format").isString() &&
                             dict.at("format").toStringRef() == distributed::sharded_optimizer_format;
      if (optimizer && dict.contains("files")) {
        c10::impl::GenericList shards(c10::TensorType::get());
        for (const auto& archive : distributed::sharded_archives(dict)) shards.push_back(archive);
        StateDict inlined;
        for (const auto& item : dict)
          if (item.key().toStringRef() != "files" && item.key().toStringRef() != "slot") inlined.insert(item.key().toStringRef(), item.value());
        inlined.insert("shards", shards);
        return inlined.to_ivalue();
      }
      const auto generic = value.toGenericDict();
      c10::impl::GenericDict copy(generic.keyType(), generic.valueType());
      for (const auto& item : generic) copy.insert(item.key(), joined(item.value()));
      return copy;
    }
    if (value.isList()) {
      const auto list = value.toList();
      c10::impl::GenericList copy(list.elementType());
      for (std::size_t i = 0; i < list.size(); ++i) copy.push_back(joined(list.get(i)));
      return copy;
    }
    return value;
  };
  save(out, StateDict(joined(checkpoint.to_ivalue()).toGenericDict()));
}

StateDict module_state_dict(const torch::nn::Module& module) {
  StateDict out;
  collect_module_state(module, "", out);
  return out;
}

namespace {
/// The prefix P most keys of `longer` have where P + a key of `shorter` is one of them ("model." when
/// `longer` holds "model.0.weight" and `shorter` "0.weight"), and how many keys it explains; "" if none.
std::pair<std::string, std::size_t> common_prefix(const std::vector<std::string>& longer, const std::vector<std::string>& shorter) {
  const std::unordered_set<std::string> targets(shorter.begin(), shorter.end());
  std::vector<std::pair<std::string, std::size_t>> counts;
  for (const std::string& key : longer)
    for (std::size_t dot = key.find('.'); dot != std::string::npos && dot + 1 < key.size(); dot = key.find('.', dot + 1))
      if (targets.count(key.substr(dot + 1)) > 0) {
        const std::string prefix = key.substr(0, dot + 1);
        const auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == prefix; });
        if (it == counts.end()) counts.emplace_back(prefix, 1);
        else ++it->second;
      }
  if (counts.empty()) return {"", 0};
  return *std::max_element(counts.begin(), counts.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
}

/// "'model.' (4 keys), 'loss_fn.' (1 key)": what keys start with (up to their first dot).
std::string prefixes_of(const std::vector<std::string>& keys) {
  std::vector<std::pair<std::string, std::size_t>> prefixes;
  for (const std::string& key : keys) {
    const std::string prefix = key.substr(0, key.find('.') == std::string::npos ? key.size() : key.find('.') + 1);
    const auto it = std::find_if(prefixes.begin(), prefixes.end(), [&](const auto& p) { return p.first == prefix; });
    if (it == prefixes.end()) prefixes.emplace_back(prefix, 1);
    else ++it->second;
  }
  std::string out;
  for (std::size_t i = 0; i < prefixes.size() && i < 6; ++i)
    out += (i ? ", '" : "'") + prefixes[i].first + "' (" + std::to_string(prefixes[i].second) + ")";
  if (prefixes.size() > 6) out += ", ...";
  return out;
}

/// "Sequential" for torch::nn::SequentialImpl, as a user names it.
std::string module_name(const torch::nn::Module& module) {
  std::string name = module.name();
  if (name.starts_with("torch::nn::")) name = name.substr(11);
  if (name.size() > 4 && name.ends_with("Impl")) name.resize(name.size() - 4);
  return name;
}

std::string quoted_list_of(const std::vector<std::string>& keys) {
  constexpr std::size_t kShown = 40;
  if (keys.size() <= kShown) return quoted_list(keys);
  return quoted_list(std::vector<std::string>(keys.begin(), keys.begin() + kShown)) + ", and " +
         std::to_string(keys.size() - kShown) + " more";
}
}  // namespace

void load_module_state_dict(torch::nn::Module& module, const StateDict& state, bool strict) {
  if (distributed::is_sharded_module_state(state))  // stage 3's weights: every rank's chunks joined
    return load_module_state_dict(module, distributed::consolidate_module_state(state), strict);
  const StateDict own = module_state_dict(module);
  std::vector<std::string> missing, unexpected, mismatched, own_keys, state_keys;
  for (const auto& item : own) {
    own_keys.push_back(item.key().toStringRef());
    if (!state.contains(own_keys.back())) missing.push_back(own_keys.back());
  }
  for (const auto& item : state) {
    if (!item.key().isString())
      throw CheckpointError("fulgur: the state_dict to load into " + module_name(module) + " has a key that is not a string (a " +
                            std::string(item.key().tagKind()) + "): it is not a module's weights.");
    state_keys.push_back(item.key().toStringRef());
    if (!own.contains(state_keys.back())) unexpected.push_back(state_keys.back());
  }
  for (const auto& item : own) {
    const std::string& key = item.key().toStringRef();
    if (!state.contains(key)) continue;
    const c10::IValue source = state.at(key);
    const at::Tensor target = item.value().toTensor();
    if (!source.isTensor() || source.toTensor().sizes() != target.sizes())
      mismatched.push_back(key + " (expected shape " + c10::str(target.sizes()) +
                           (source.isTensor() ? ", got " + c10::str(source.toTensor().sizes()) : ", got a non-tensor") + ")");
  }
  const bool differ = strict && (!missing.empty() || !unexpected.empty());
  if (!mismatched.empty() || differ) {
    // The first line keeps "does not fit the module": fit's resume names the checkpoint with it.
    std::string message = "fulgur: the state_dict does not fit the module " + module_name(module) +
                          ". Error(s) in loading state_dict for " + module_name(module) + ":";
    if (differ && !missing.empty()) message += "\n\tMissing key(s) in state_dict: " + quoted_list_of(missing) + ".";
    if (differ && !unexpected.empty()) message += "\n\tUnexpected key(s) in state_dict: " + quoted_list_of(unexpected) + ".";
    for (const auto& m : mismatched) message += "\n\tsize mismatch for " + m + ".";
    const auto [extra, taken_off] = common_prefix(unexpected, missing);  // the state_dict's keys have it
    const auto [lacking, put_on] = common_prefix(missing, unexpected);   // the module's keys have it
    if (differ && taken_off > 0 && taken_off >= put_on) {
      message += "\nThe state_dict's keys start with '" + extra + "' where the module's do not (a LightningModule "
                 "holding the network as self." + extra.substr(0, extra.size() - 1) + "): take it off with "
                 "fulgur::checkpoint::module_weights(checkpoint, \"" + extra + "\").";
    } else if (differ && put_on > 0) {
      message += "\nThe module's keys start with '" + lacking + "' where the state_dict's do not: load it into the "
                 "submodule that holds them (" + lacking.substr(0, lacking.size() - 1) + "), or build the module "
                 "as the network that was saved.";
    } else if (differ && missing.size() == own_keys.size() && !state_keys.empty()) {
      message += "\nNo key matches: the state_dict's keys start with " + prefixes_of(state_keys) +
                 ", the module's with " + (own_keys.empty() ? std::string("nothing (it has no parameters)") : prefixes_of(own_keys)) +
                 ". Is it this network's checkpoint? A prefix can be taken off with "
                 "fulgur::checkpoint::module_weights(checkpoint, prefix).";
    } else if (differ) {
      message += std::string("\nThe module ") +
                 (!missing.empty() && !unexpected.empty() ? "and the saved network have different layers"
                  : !missing.empty()                      ? "has layers the saved network lacks (the missing keys)"
                                                          : "lacks layers the saved network has (the unexpected keys)") +
                 ": build it as the network that was saved.";
    }
    if (!mismatched.empty())
      message += "\nThe saved network's layers have other sizes: build the module with the sizes it was trained "
                 "with (a Lightning checkpoint keeps them in 'hyper_parameters').";
    if (differ) message += "\nTo load only the keys that match, pass strict = false.";
    throw CheckpointError(message);
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
  if (!state.contains("archive") && state.contains("state") && state.contains("param_groups"))
    throw CheckpointError(
        "fulgur: this optimizer state is a PyTorch (Python) optimizer's state_dict(), as Lightning checkpoints hold "
        "them in 'optimizer_states'; LibTorch's optimizers keep their state in another form, which fulgur does not "
        "convert. Load the checkpoint's weights (checkpoint::module_weights) and let the optimizer start afresh.");
  if (state.contains("format") && state.at("format").isString() &&
      state.at("format").toStringRef() == "fulgur-sharded-optimizer") {
    // Every rank's shard, joined into the optimizer's own parameters: the consolidated state.
    const std::vector<at::Tensor> archives = distributed::sharded_archives(state);
    distributed::ShardedOptimizerState(optimizer, archives, distributed::sharded_layout(state)).load_whole(optimizer);
    return;
  }
  if (!state.contains("archive") || !state.at("archive").isTensor())
    throw Error("fulgur: the optimizer state has no 'archive' entry; pass a state from optimizer_state_dict().");
  const at::Tensor bytes = state.at("archive").toTensor().contiguous();
  std::istringstream stream(std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<std::size_t>(bytes.numel())));
  torch::serialize::InputArchive archive;
  archive.load_from(stream);
  optimizer.load(archive);
}

}  // namespace fulgur::checkpoint
