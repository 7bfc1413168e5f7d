// Checkpoint files: a StateDict as torch.save's zip and back, written atomically, read with every
// byte checked (include/fulgur/checkpoint/io.hpp). The zip and the pickle are read by zip.cpp,
// pickle_check.cpp and pickle_reader.cpp; a format that keeps parts beside the file is a
// checkpoint::Format (formats.cpp).
#include "fulgur/checkpoint/io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <unordered_map>
#include <unordered_set>

#include "fulgur/detail/atomic_file.hpp"
#include "fulgur/detail/describe.hpp"
#include "fulgur/detail/files.hpp"
#include "fulgur/errors.hpp"
#include "src/checkpoint/formats.hpp"
#include "src/checkpoint/reading.hpp"

namespace fulgur::checkpoint {

using namespace reading;

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

namespace {

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
    if (const std::string problem = pickle_problem(pickled, pickle_size); !problem.empty()) complain.corrupt(problem);
    auto read_record = [&](const std::string& key) {
      auto [record, record_size] = archive.getRecord("data/" + key);
      record_sizes[record.get()] = record_size;
      return std::pair<at::DataPtr, std::size_t>(std::move(record), record_size);
    };
    auto check = [&](const at::Tensor& t, const std::string& where) { check_tensor(t, where, record_sizes, complain); };
    // Tensors load on the CPU, as Lightning's map_location puts them.
    PickleRead read = read_pickle(pickled, pickle_size, read_record, check);
    value = std::move(read.value);
    objects = std::move(read.python_objects);
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

void save(const std::string& path, const StateDict& state) {
  const std::vector<char> bytes = to_bytes(state);
  try {
    detail::atomic_write(path, std::string_view(bytes.data(), bytes.size()), "checkpoint");
  } catch (const detail::FileWriteError& e) {
    throw CheckpointError(e.what());
  }
}

void remove(const std::string& path) {
  ::unlink(path.c_str());
  for (const Format* format : formats()) format->remove_beside(path);
}
StateDict load(const std::string& path, const LoadOptions& options) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer forever (no effect on regular files).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    throw CheckpointError("fulgur: cannot open checkpoint '" + path + "': " + std::strerror(errno) +
                          ". Check the path.");
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
  parts::open(state, detail::parent_folder(path));  // a format's parts beside the file, found from anywhere
  return state;
}

void consolidate(const std::string& path, const std::string& out) { save(out, parts::inlined(load(path))); }

}  // namespace fulgur::checkpoint
