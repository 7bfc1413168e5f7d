#pragma once
// What the checkpoint reader's parts share (src/checkpoint/: zip.cpp, pickle_check.cpp,
// pickle_reader.cpp, io.cpp). Private to libfulgur.
//
// LibTorch's reader trusts the file: a data.pkl of a million TUPLE1 opcodes overflows the stack when
// the tuples are freed, a tensor whose size or storage claims more bytes than its record reads past
// the record, a forged memo index or string length allocates gigabytes, and a flipped bit in a tensor
// loads silently (its zip reader skips the CRC-32); its unpickler cannot read Python's OrderedDict
// (every module's state_dict) and knows no Python class. The reader below checks the zip, the pickle
// and the tensors itself, so that such a file is a CheckpointError, never a crash or a wrong tensor,
// and reads the pickle itself (LibTorch reads the zip): a dry run first (PickleCheck), then the values
// (PickleReader), never running anything the pickle names.
#include <ATen/core/ivalue.h>
#include <c10/core/QScheme.h>
#include <c10/core/ScalarType.h>

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "fulgur/errors.hpp"

namespace fulgur::checkpoint::reading {

static_assert(std::endian::native == std::endian::little, "the zip and pickle readers read little-endian");

/// The little-endian number of `bytes` bytes at p.
inline std::uint64_t le(const unsigned char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}
/// [at, at + n) lies within [0, limit), without overflow.
inline bool fits(std::uint64_t at, std::uint64_t n, std::uint64_t limit) { return at <= limit && n <= limit - at; }

/// Wide enough for a product of two 62-bit extents: views are checked without overflow. GCC and
/// clang have it; __extension__ says so to -Wpedantic.
__extension__ typedef __int128 wide_int;

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

// ---- the zip (zip.cpp) --------------------------------------------------------------------------
struct ZipRecord {
  std::string name;
  std::uint64_t data = 0, stored = 0, size = 0;  // offset of the bytes, their count, and uncompressed
  std::uint32_t crc = 0;
  std::uint16_t method = 0;
};

/// The zip's records, each checked against the file as miniz (LibTorch's zip reader) reads them:
/// the end record found the same way, every record's header and bytes inside the file before the
/// directory, sizes that stored bytes can have, and the CRC-32 of stored records.
std::vector<ZipRecord> read_zip_directory(const unsigned char* b, std::uint64_t size, const Complaint& complain);

// ---- the pickle's globals, its dry run (pickle_check.cpp) and its reader (pickle_reader.cpp) ----
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

GlobalName classify(const std::string& module_name, const std::string& name);

/// A dry run of the reader over the pickle's opcodes, before anything is built: "" when the
/// pickle can be read safely, or what is wrong with it.
std::string pickle_problem(const unsigned char* data, std::size_t size);

/// What a checkpoint holds that fulgur reads but has no use for: a dictionary keyed by a Python
/// object, a quantization scheme it cannot rebuild. Not corruption: the file is as it was written.
struct Unreadable {
  std::string problem;
};


/// "'a'['b'][3]": where a value is, for messages.
std::string child_path(const std::string& where, const c10::IValue& key);

/// The record "data/<key>" of the archive: its bytes and their count.
using RecordReader = std::function<std::pair<at::DataPtr, std::size_t>(const std::string& key)>;
/// Checks a tensor against its storage before it is used, not only once the pickle is read.
using TensorCheck = std::function<void(const at::Tensor& tensor, const std::string& what)>;

struct PickleRead {
  c10::IValue value;
  /// The Python objects it holds: class, where.
  std::vector<std::pair<std::string, std::string>> python_objects;
};
/// Builds what a pickle that pickle_problem passed stands for, without running anything. Throws a
/// std::string (corrupt), Unreadable, or CheckpointError.
PickleRead read_pickle(const unsigned char* data, std::size_t size, RecordReader read_record, TensorCheck check);

}  // namespace fulgur::checkpoint::reading
