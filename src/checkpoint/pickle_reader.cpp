// The reader of a checkpoint's pickle (reading.hpp: read_pickle): what Python's unpickler builds,
// without running anything the pickle names.
#include <ATen/ATen.h>

#include <cstring>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "src/checkpoint/reading.hpp"

namespace fulgur::checkpoint::reading {

/// "'a'['b'][3]": where a value is, for messages.
std::string child_path(const std::string& where, const c10::IValue& key) {
  if (key.isString()) return where.empty() ? "'" + key.toStringRef() + "'" : where + "['" + key.toStringRef() + "']";
  if (key.isInt()) return where + "[" + std::to_string(key.toInt()) + "]";
  return where + "[?]";
}

namespace {

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

}  // namespace

PickleRead read_pickle(const unsigned char* data, std::size_t size, RecordReader read_record, TensorCheck check) {
  PickleReader reader(data, size, std::move(read_record), std::move(check));
  PickleRead out;
  out.value = reader.read();
  out.python_objects = reader.python_objects(out.value);
  return out;
}

}  // namespace fulgur::checkpoint::reading
