#pragma once
// The checkpoint fuzzer's inputs (tests/checkpoint/fuzz.cpp): the seed checkpoints (fulgur's own and one
// written as Python's torch.save lays it out) and the mutations made of them, reproducible per (seed, n).
#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <caffe2/serialize/inline_container.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/state_dict.hpp"
#include "tests/fuzz/rng.hpp"

namespace checkpoint_fuzz {

using Bytes = std::vector<char>;

// ---- seeds ---------------------------------------------------------------------------------------

inline c10::impl::GenericDict dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

/// Nested dicts, a list, a tuple, tensors of eight dtypes (a scalar, an empty one, one stored twice), numbers, strings.
inline fulgur::StateDict rich_state() {
  auto deeper = dict();
  deeper.insert("int8", at::arange(-3, 3, at::kChar));
  deeper.insert("note", std::string("deep"));
  auto model = dict();
  const at::Tensor weight = at::arange(24, at::kFloat).reshape({4, 6});
  model.insert("weight", weight);
  model.insert("bias", at::linspace(-1, 1, 6, at::kDouble));
  model.insert("steps", at::arange(5, at::kLong));
  model.insert("mask", at::arange(7) % 2 == 0);
  model.insert("half", at::ones({3}, at::kHalf));
  model.insert("bf16", at::full({2, 2}, 0.5, at::kBFloat16));
  model.insert("bytes", at::arange(9, at::kByte));
  model.insert("int32", at::arange(4, at::kInt));
  model.insert("scalar", at::scalar_tensor(3.5));
  model.insert("empty", at::empty({0, 3}));
  model.insert("deeper", deeper);
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(int64_t{1});
  list.push_back(2.5);
  list.push_back(std::string("three"));
  list.push_back(at::arange(4, at::kInt));
  fulgur::StateDict state;
  state.insert("model", model);
  state.insert("list", list);
  state.insert("pair", c10::ivalue::Tuple::create({c10::IValue(int64_t{3}), c10::IValue(std::string("x"))}));
  state.insert("same_weight", weight);
  state.insert("epoch", int64_t{7});
  state.insert("big", int64_t{1} << 40);
  state.insert("lr", 1e-3);
  state.insert("name", std::string("fuzz"));
  state.insert("flag", true);
  state.insert("nothing", c10::IValue());
  return state;
}

struct Field {
  std::size_t at;
  std::size_t width;
};

/// A valid checkpoint and where its parts are: the zip's header fields, the pickle, its opcodes.
struct Seed {
  Bytes bytes;
  std::vector<Field> zip_fields;
  std::vector<std::pair<std::string, Bytes>> records;  // name inside the archive folder, bytes
  std::string pickle;
  std::vector<std::size_t> ops;  // offsets of the pickle's opcodes
  std::size_t pickle_at = 0;     // offset of the pickle in `bytes`
  std::vector<std::size_t> pickle_crcs;
};

inline std::uint64_t le(const Bytes& b, std::size_t at, std::size_t width) {
  std::uint64_t v = 0;
  for (std::size_t i = width; i-- > 0;) v = v << 8 | static_cast<unsigned char>(b.at(at + i));
  return v;
}
inline void put_le(Bytes& b, std::size_t at, std::size_t width, std::uint64_t v) {
  for (std::size_t i = 0; i < width && at + i < b.size(); ++i) b[at + i] = static_cast<char>(v >> (8 * i));
}
/// b.begin() + offset, with the offset's sign made explicit.
template <class Container>
inline auto iterator_at(Container& c, std::size_t offset) {
  return c.begin() + static_cast<std::ptrdiff_t>(offset);
}

/// The length of the opcode at `at` with its arguments (a valid pickle).
inline std::size_t op_length(const std::string& p, std::size_t at) {
  const auto u = [&](std::size_t i) { return static_cast<std::uint64_t>(static_cast<unsigned char>(p.at(i))); };
  switch (static_cast<unsigned char>(p[at])) {
    case 0x80: case 'K': case 'h': case 'q': return 2;
    case 'M': return 3;
    case 'J': case 'j': case 'r': return 5;
    case 'G': return 9;
    case 0x8a: return 2 + u(at + 1);
    case 'X': return 5 + (u(at + 1) | u(at + 2) << 8 | u(at + 3) << 16 | u(at + 4) << 24);
    case 'c': {
      const std::size_t first = p.find('\n', at);
      return p.find('\n', first + 1) + 1 - at;
    }
    default: return 1;
  }
}

inline Seed make_seed(Bytes bytes) {
  Seed s;
  s.bytes = std::move(bytes);
  const Bytes& b = s.bytes;
  std::size_t eocd = b.size() - 22;
  while (le(b, eocd, 4) != 0x06054b50) --eocd;
  s.zip_fields = {{eocd + 8, 2}, {eocd + 10, 2}, {eocd + 12, 4}, {eocd + 16, 4}, {eocd + 20, 2}};
  std::uint64_t entries = le(b, eocd + 10, 2), directory = le(b, eocd + 16, 4);
  if (le(b, eocd - 20, 4) == 0x07064b50) {
    const std::size_t z = le(b, eocd - 20 + 8, 8);
    for (Field f : {Field{eocd - 20 + 8, 8}, Field{eocd - 20 + 16, 4}, Field{z + 4, 8}, Field{z + 16, 4}, Field{z + 24, 8},
                    Field{z + 32, 8}, Field{z + 40, 8}, Field{z + 48, 8}})
      s.zip_fields.push_back(f);
    entries = le(b, z + 32, 8), directory = le(b, z + 48, 8);
  }
  std::size_t p = directory;
  for (std::uint64_t i = 0; i < entries; ++i) {
    const std::size_t name_size = le(b, p + 28, 2), extra = le(b, p + 30, 2), comment = le(b, p + 32, 2);
    const std::size_t header = le(b, p + 42, 4);
    for (Field f : {Field{p + 8, 2}, Field{p + 10, 2}, Field{p + 16, 4}, Field{p + 20, 4}, Field{p + 24, 4}, Field{p + 28, 2},
                    Field{p + 30, 2}, Field{p + 32, 2}, Field{p + 34, 2}, Field{p + 42, 4}, Field{header, 4},
                    Field{header + 8, 2}, Field{header + 14, 4}, Field{header + 18, 4}, Field{header + 22, 4},
                    Field{header + 26, 2}, Field{header + 28, 2}})
      s.zip_fields.push_back(f);
    const std::string name(iterator_at(b, p + 46), iterator_at(b, p + 46 + name_size));
    const std::size_t data = header + 30 + le(b, header + 26, 2) + le(b, header + 28, 2), size = le(b, p + 20, 4);
    const std::string inner = name.substr(name.find('/') + 1);
    if (inner == "data.pkl") {
      s.pickle.assign(iterator_at(b, data), iterator_at(b, data + size));
      s.pickle_at = data;
      s.pickle_crcs = {p + 16, header + 14};
    }
    if (inner == "data.pkl" || inner.rfind("data/", 0) == 0) s.records.push_back({inner, Bytes(iterator_at(b, data), iterator_at(b, data + size))});
    p += 46 + name_size + extra + comment;
  }
  for (std::size_t at = 0; at < s.pickle.size(); at += op_length(s.pickle, at)) s.ops.push_back(at);
  return s;
}

/// The pickle written into a zip as LibTorch writes it, with the seed's tensor records.
inline Bytes rezip(const Seed& seed, const std::string& pickle) {
  Bytes out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, std::size_t size) {
    out.insert(out.end(), static_cast<const char*>(bytes), static_cast<const char*>(bytes) + size);
    return size;
  });
  writer.writeRecord("data.pkl", pickle.data(), pickle.size());
  for (const auto& [name, data] : seed.records)
    if (name != "data.pkl") writer.writeRecord(name, data.data(), data.size());
  writer.writeEndOfFile();
  return out;
}

/// A checkpoint as Python's torch.save and Lightning write it, by hand: a state_dict that is an
/// OrderedDict with _metadata set by BUILD, hyperparameters that are Python objects (REDUCE, NEWOBJ
/// with BUILD or SETITEMS, a class reference, Python 2 module names), short LONG1 integers, a complex
/// number, a device, a Parameter and a _rebuild_tensor_v3 tensor over an UntypedStorage.
inline Bytes python_seed() {
  const auto text = [](const std::string& s) {
    std::string out = "X";
    for (int i = 0; i < 4; ++i) out += static_cast<char>(s.size() >> (8 * i));
    return out + s;
  };
  const auto storage = [&](const std::string& type, const std::string& key, int count) {
    return "((" + text("storage") + type + text(key) + text("cpu") + "K" + static_cast<char>(count) + "tQ";
  };
  const auto k = [](int v) { return std::string("K") + static_cast<char>(v); };  // BININT1
  const std::string hooks = "\x89h\x01)R";  // requires_grad False, OrderedDict() of backward hooks
  std::string p = std::string("\x80\x02}q\x00(", 6);
  p += text("state_dict") + "ccollections\nOrderedDict\nq\x01)Rq\x02(";
  p += text("model.0.weight") + "ctorch._utils\n_rebuild_tensor_v2\nq\x03" + storage("ctorch\nFloatStorage\nq\x04", "0", 6) +
       k(0) + k(2) + k(3) + "\x86" + k(3) + k(1) + "\x86" + hooks + "tR";
  p += text("model.0.bias") + "h\x03" + storage("h\x04", "1", 2) + k(0) + k(2) + "\x85" + k(1) + "\x85" + hooks + "tR";
  p += "u}(" + text("_metadata") + "h\x01)R(" + text("") + "}" + text("version") + "K\x01suub";
  p += text("hyper_parameters") + "}(";
  p += text("data_dir") + "cpathlib\nPosixPath\n(" + text("/") + text("data") + "tR";
  p += text("activation") + "c__main__\nActivation\n" + text("tanh") + "\x85R";
  p += text("config") + "cargparse\nNamespace\n)\x81}" + text("seed") + "K\x07sb";
  p += text("extra") + "clightning.fabric.utilities.data\nAttributeDict\n)\x81(" + text("note") + text("kept") + "u";
  p += text("dtype") + "ctorch\nfloat32\n";
  p += text("ids") + "c__builtin__\nset\n](K\x01K\x02" "e\x85R";
  p += text("big") + std::string("\x8a\x05\x00\x00\x00\x00\x02", 7) + text("negative") + "\x8a\x01\xff";
  p += text("z") + "c__builtin__\ncomplex\nG" + std::string("\x3f\xf8\0\0\0\0\0\0", 8) + "G" +
       std::string("\xc0\0\0\0\0\0\0\0", 8) + "\x86R";
  p += text("device") + "ctorch\ndevice\n" + text("cuda") + "K\x01\x86R";
  p += "u";
  p += text("param") + "ctorch._utils\n_rebuild_parameter\n(h\x03" + storage("h\x04", "0", 6) +
       k(0) + k(6) + "\x85" + k(1) + "\x85" + hooks + "tR\x88h\x01)RtR";
  p += text("float8") + "ctorch._utils\n_rebuild_tensor_v3\n" + storage("ctorch.storage\nUntypedStorage\n", "2", 4) +
       k(0) + k(4) + "\x85" + k(1) + "\x85" + hooks + "ctorch\nfloat8_e4m3fn\ntR";
  p += "u.";
  Bytes out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, std::size_t size) {
    out.insert(out.end(), static_cast<const char*>(bytes), static_cast<const char*>(bytes) + size);
    return size;
  });
  const at::Tensor weights = at::arange(6, at::kFloat), bias = at::ones({2}, at::kFloat);
  const unsigned char float8[4] = {0x38, 0x40, 0x44, 0x48};
  writer.writeRecord("data.pkl", p.data(), p.size());
  writer.writeRecord("data/0", weights.data_ptr(), 24);
  writer.writeRecord("data/1", bias.data_ptr(), 8);
  writer.writeRecord("data/2", float8, 4);
  writer.writeEndOfFile();
  return out;
}

// ---- mutations ---------------------------------------------------------------------------------

using fuzzing::Rng;

inline std::uint64_t interesting(Rng& rng, std::uint64_t original, std::uint64_t file_size) {
  switch (rng.below(12)) {
    case 0: return 0;
    case 1: return 1;
    case 2: return original + 1;
    case 3: return original - 1;
    case 4: return original * 2;
    case 5: return original + 1000;
    case 6: return 0xFFFFFFFFull;
    case 7: return 0x7FFFFFFFull;
    case 8: return ~0ull;
    case 9: return 0x7FFFFFFFFFFFFFFFull;
    case 10: return file_size + rng.below(64);
    default: return rng.next();
  }
}

inline void byte_mutation(Bytes& b, Rng& rng) {
  if (b.empty()) return;
  const std::size_t n = b.size();
  switch (rng.below(8)) {
    case 0: b[rng.below(n)] ^= static_cast<char>(1u << rng.below(8)); break;  // bit flip
    case 1:                                                                     // bytes overwritten
      for (std::size_t k = 0, at = rng.below(n), count = 1 + rng.below(8); k < count && at + k < n; ++k)
        b[at + k] = static_cast<char>(rng.next());
      break;
    case 2: {  // an integer overwritten
      const std::size_t width = std::size_t{1} << rng.below(4);
      const std::size_t at = rng.below(n);
      put_le(b, at, width, interesting(rng, at + width <= n ? le(b, at, width) : 0, n));
    } break;
    case 3: b.resize(rng.below(n)); break;  // truncated
    case 4: {                               // a chunk duplicated
      const std::size_t at = rng.below(n), len = 1 + rng.below(std::min<std::size_t>(n - at, 512));
      const Bytes chunk(iterator_at(b, at), iterator_at(b, at + len));
      b.insert(iterator_at(b, rng.below(n + 1)), chunk.begin(), chunk.end());
    } break;
    case 5: {  // a chunk removed
      const std::size_t at = rng.below(n), len = 1 + rng.below(std::min<std::size_t>(n - at, 512));
      b.erase(iterator_at(b, at), iterator_at(b, at + len));
    } break;
    case 6: {  // random bytes inserted
      Bytes chunk(1 + rng.below(64));
      for (char& c : chunk) c = static_cast<char>(rng.next());
      b.insert(iterator_at(b, rng.below(n + 1)), chunk.begin(), chunk.end());
    } break;
    default: b.resize(n - std::min(n, 1 + rng.below(64))); break;  // a few bytes off the end
  }
}

inline std::uint32_t crc32(const char* data, std::size_t size) {
  std::uint32_t c = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < size; ++i) {
    c ^= static_cast<unsigned char>(data[i]);
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return c ^ 0xFFFFFFFFu;
}

inline const char kOpcodes[] = "()NGJKMQRX]abcdehjlqrstu}.\x81\x85\x86\x87\x88\x89\x8a\x8d\x80\x94\x95\x8c";

/// A value that an unpickler mishandles (LibTorch's did) unless fulgur refuses it first.
inline std::string hostile_value(Rng& rng) {
  static const std::size_t depths[] = {10, 999, 1000, 1001, 5000, 200000};
  const std::size_t depth = depths[rng.below(std::size(depths))];
  switch (rng.below(9)) {
    case 0: return "N" + std::string(depth, '\x85');                          // tuples in tuples
    case 1: {                                                                   // lists in lists, through the memo
      std::string s = "]q\x01";
      for (std::size_t i = 0; i < depth; ++i) s += std::string("]h\x01" "aq\x01", 6);
      return s;
    }
    case 2: return std::string("]q\x02h\x02" "a", 6);                         // a list holding itself
    case 3: return std::string("}q\x03X\x01\x00\x00\x00kh\x03s", 12);         // a dict holding itself
    case 4: return std::string("Nr\xff\xff\xff\x0f", 6);                      // memo index 2^28
    case 5: return std::string("X\xff\xff\xff\x7f", 5);                       // a 2 GB string
    case 6: return std::string("\x8d\x00\x00\x00\x00\x01\x00\x00\x00", 9);    // a 4 GB string
    case 7: return std::string("ctorch._tensor\n_rebuild_from_type_v2\n(NNN}tR", 43);  // a call before its target
    default: return std::string("(((((((((t", 10) + std::string(depth % 50, 'e');  // unbalanced marks
  }
}

inline std::string pickle_mutation(const Seed& seed, Rng& rng) {
  std::string p = seed.pickle;
  const std::size_t op = seed.ops.empty() ? 0 : seed.ops[rng.below(seed.ops.size())];
  const std::size_t len = seed.ops.empty() ? 0 : op_length(p, op);
  switch (rng.below(8)) {
    case 0: p.erase(op, len); break;                                  // an opcode removed
    case 1: p.insert(op, p.substr(op, len)); break;                   // an opcode repeated
    case 2: p[op] = kOpcodes[rng.below(sizeof kOpcodes - 1)]; break;  // an opcode replaced
    case 3: {                                                         // an opcode's integer argument
      const unsigned char c = static_cast<unsigned char>(p[op]);
      std::size_t width = 0;
      switch (c) {
        case 'K': case 'h': case 'q': width = 1; break;
        case 'M': width = 2; break;
        case 'J': case 'j': case 'r': case 'X': width = 4; break;
        case 0x8a: width = 8; break;
        default: break;
      }
      const std::size_t from = op + 1 + (c == 0x8a ? 1 : 0);  // LONG1 has a length byte first
      if (width == 0 || from + width > p.size()) break;
      Bytes arg(iterator_at(p, from), iterator_at(p, from + width));
      put_le(arg, 0, width, interesting(rng, le(arg, 0, width), p.size()));
      std::copy(arg.begin(), arg.end(), iterator_at(p, from));
    } break;
    case 4: {  // a run of opcodes moved elsewhere
      const std::size_t end = seed.ops[std::min(seed.ops.size() - 1, rng.below(seed.ops.size()))];
      if (end <= op) break;
      const std::string run = p.substr(op, end - op);
      p.erase(op, end - op);
      p.insert(std::min(p.size(), seed.ops[rng.below(seed.ops.size())]), run);
    } break;
    case 5: p.insert(op, hostile_value(rng)); break;  // hostile value in the middle
    case 6:  // hostile value as the value of a well-formed dict
      p = std::string("\x80\x02}(X\x01\x00\x00\x00k", 10) + hostile_value(rng) + "u.";
      break;
    default: {  // byte-level, inside the pickle
      Bytes b(p.begin(), p.end());
      byte_mutation(b, rng);
      p.assign(b.begin(), b.end());
    }
  }
  return p;
}

inline Bytes mutate(const Seed& seed, Rng& rng) {
  Bytes b;
  switch (rng.below(10)) {
    case 0: case 1: case 2: case 3: case 4:  // the pickle, re-zipped: the unpickler sees it
      b = rezip(seed, pickle_mutation(seed, rng));
      break;
    case 5: {  // the pickle in place, CRC-32 fixed
      b = seed.bytes;
      Bytes p(seed.pickle.begin(), seed.pickle.end());
      const std::size_t at = rng.below(p.size());
      if (rng.one_in(2)) p[at] ^= static_cast<char>(1u << rng.below(8));
      else p[at] = kOpcodes[rng.below(sizeof kOpcodes - 1)];
      std::copy(p.begin(), p.end(), iterator_at(b, seed.pickle_at));
      for (std::size_t crc : seed.pickle_crcs) put_le(b, crc, 4, crc32(p.data(), p.size()));
    } break;
    case 6: case 7: {  // zip header fields
      b = seed.bytes;
      for (std::size_t k = 0, count = 1 + rng.below(2); k < count; ++k) {
        const Field f = seed.zip_fields[rng.below(seed.zip_fields.size())];
        put_le(b, f.at, f.width, interesting(rng, le(b, f.at, f.width), b.size()));
      }
    } break;
    default:  // anywhere
      b = seed.bytes;
      break;
  }
  // Anywhere: one or two byte mutations; after a targeted one, rarely more (they mostly break the zip).
  const std::size_t count = b == seed.bytes ? 1 + rng.below(2) : rng.one_in(4);
  for (std::size_t k = 0; k < count; ++k) byte_mutation(b, rng);
  return b;
}

}  // namespace checkpoint_fuzz
