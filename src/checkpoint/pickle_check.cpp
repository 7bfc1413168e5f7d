// The dry run of a checkpoint's pickle (reading.hpp: pickle_problem), and what its globals are.
#include <c10/core/ScalarType.h>

#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "src/checkpoint/reading.hpp"

namespace fulgur::checkpoint::reading {

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

namespace {

constexpr std::size_t kMaxNesting = 1000;  // containers within containers; IValues are freed recursively

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

}  // namespace

std::string pickle_problem(const unsigned char* data, std::size_t size) { return PickleCheck(data, size).problem(); }

}  // namespace fulgur::checkpoint::reading
