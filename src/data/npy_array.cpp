// fulgur::data::NpyArray (include/fulgur/data/npy_array.hpp).
//
// The format (numpy/lib/format.py): the magic "\x93NUMPY", a major and a minor version byte, the
// header's length (uint16 in 1.0, uint32 in 2.0 and 3.0, little-endian), then the header: a Python
// dict literal such as {'descr': '<f4', 'fortran_order': False, 'shape': (10, 3), } padded with
// spaces and ended by '\n' (3.0 only allows UTF-8 in it); the data follows at once.
#include "fulgur/data/npy_array.hpp"

#include <ATen/ATen.h>

#include <array>
#include <bit>
#include <cstring>
#include <string_view>
#include <utility>

#include "fulgur/errors.hpp"
#include "src/data/mapped_file.hpp"

namespace fulgur::data {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + (shape.size() == 1 ? ",)" : ")");
}

/// The header without NumPy's padding (spaces and a newline), to quote in a message.
std::string_view trimmed(std::string_view text) {
  const std::size_t end = text.find_last_not_of(" \t\r\n");
  return end == std::string_view::npos ? std::string_view() : text.substr(0, end + 1);
}

struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
};

/// The header dict as Python's literal syntax allows NumPy (and hand-written files) to spell it:
/// any whitespace, either quote, a trailing comma or none, keys in any order.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : text_(text), path_(path) {}

  Header parse() {
    Header header;
    bool seen_descr = false, seen_order = false, seen_shape = false;
    expect('{', "'{' opening the header dict");
    while (!consume('}')) {
      const std::string key = string_literal();
      expect(':', "':' after the key '" + key + "'");
      if (key == "descr") {
        once(seen_descr, key);
        skip_space();
        if (position_ < text_.size() && text_[position_] == '[')
          throw DataError("NpyArray: " + path_ +
                          " holds a structured (record) array, whose samples are not one tensor: save each field "
                          "as its own array (np.save(path, a['field'])).");
        header.descr = string_literal();
      } else if (key == "fortran_order") {
        once(seen_order, key);
        header.fortran_order = boolean();
      } else if (key == "shape") {
        once(seen_shape, key);
        header.shape = tuple();
      } else {
        fail("an unknown key '" + key + "' (a .npy header has 'descr', 'fortran_order' and 'shape')");
      }
      if (!consume(',')) {
        expect('}', "',' or '}' after the value of '" + key + "'");
        break;
      }
    }
    skip_space();
    if (position_ != text_.size()) fail("text after the closing '}'");
    if (!seen_descr || !seen_order || !seen_shape)
      fail(std::string("no '") + (!seen_descr ? "descr" : !seen_order ? "fortran_order" : "shape") + "' key");
    return header;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw DataError("NpyArray: " + path_ + " has a malformed header: " + what + " at character " +
                    std::to_string(position_) + " of `" + std::string(trimmed(text_)) +
                    "`; write the file with np.save (or numpy.lib.format.write_array).");
  }
  void skip_space() {
    while (position_ < text_.size() && (text_[position_] == ' ' || text_[position_] == '\t' ||
                                        text_[position_] == '\n' || text_[position_] == '\r'))
      ++position_;
  }
  bool consume(char c) {
    skip_space();
    if (position_ < text_.size() && text_[position_] == c) {
      ++position_;
      return true;
    }
    return false;
  }
  void expect(char c, const std::string& what) {
    if (!consume(c)) fail("expected " + what);
  }
  void once(bool& seen, const std::string& key) {
    if (seen) fail("a second '" + key + "' key");
    seen = true;
  }
  std::string string_literal() {
    skip_space();
    if (position_ >= text_.size() || (text_[position_] != '\'' && text_[position_] != '"'))
      fail("expected a quoted string");
    const char quote = text_[position_++];
    const std::size_t end = text_.find(quote, position_);
    if (end == std::string_view::npos) fail("an unterminated string");
    std::string value(text_.substr(position_, end - position_));
    position_ = end + 1;
    return value;
  }
  bool boolean() {
    skip_space();
    for (const auto& [word, value] :
         {std::pair{std::string_view("True"), true}, std::pair{std::string_view("False"), false}})
      if (text_.substr(position_, word.size()) == word) {
        position_ += word.size();
        return value;
      }
    fail("expected True or False");
  }
  std::vector<std::int64_t> tuple() {
    expect('(', "'(' opening the shape");
    std::vector<std::int64_t> values;
    while (!consume(')')) {
      values.push_back(integer());
      if (!consume('L')) consume('l');  // Python 2 wrote longs so: (3L, 4L)
      if (!consume(',')) {
        expect(')', "',' or ')' in the shape");
        break;
      }
    }
    return values;
  }
  std::int64_t integer() {
    skip_space();
    const std::size_t start = position_;
    std::int64_t value = 0;
    for (; position_ < text_.size() && text_[position_] >= '0' && text_[position_] <= '9'; ++position_) {
      const int digit = text_[position_] - '0';
      if (value > (INT64_MAX - digit) / 10) fail("a dimension too large for int64");
      value = value * 10 + digit;
    }
    if (position_ == start) fail("expected a non-negative integer dimension");
    return value;
  }

  std::string_view text_;
  const std::string& path_;
  std::size_t position_ = 0;
};

/// The LibTorch type of a descr's kind and size ("f4"), or Undefined.
at::ScalarType scalar_type_of(std::string_view code) {
  static constexpr std::array<std::pair<std::string_view, at::ScalarType>, 14> kTypes{{
      {"b1", at::kBool},
      {"u1", at::kByte},
      {"i1", at::kChar},
      {"i2", at::kShort},
      {"u2", at::kUInt16},
      {"i4", at::kInt},
      {"u4", at::kUInt32},
      {"i8", at::kLong},
      {"u8", at::kUInt64},
      {"f2", at::kHalf},
      {"f4", at::kFloat},
      {"f8", at::kDouble},
      {"c8", at::kComplexFloat},
      {"c16", at::kComplexDouble},
  }};
  for (const auto& [name, type] : kTypes)
    if (name == code) return type;
  return at::ScalarType::Undefined;
}

at::ScalarType checked_dtype(const std::string& descr, const std::string& path) {
  const std::string_view order = descr.empty() ? "" : std::string_view(descr).substr(0, 1);
  const at::ScalarType type =
      order.find_first_of("<>|=") == 0 ? scalar_type_of(std::string_view(descr).substr(1)) : at::ScalarType::Undefined;
  if (type == at::ScalarType::Undefined) {
    const std::string why = descr.find('O') != std::string::npos ? "Python objects (pickled, not laid out in memory)"
                                                                 : "a dtype with no LibTorch equivalent";
    throw DataError("NpyArray: " + path + " holds dtype '" + descr + "', " + why +
                    "; supported: |b1 |u1 |i1 <i2 <u2 <i4 <u4 <i8 <u8 <f2 <f4 <f8 <c8 <c16: convert it first, "
                    "e.g. np.save(path, a.astype(np.float32)).");
  }
  // '=' and '|' are the writer's native order; one-byte types have none to get wrong.
  constexpr bool native_little = std::endian::native == std::endian::little;
  const bool stored_little = order == "<" || (order != ">" && native_little);
  if (at::elementSize(type) > 1 && stored_little != native_little)
    throw DataError("NpyArray: " + path + " is stored " + (stored_little ? "little" : "big") + "-endian ('" + descr +
                    "') and is mapped as it is, so it must be in this machine's byte order: save it with "
                    "np.save(path, a.astype(a.dtype.newbyteorder('" +
                    (native_little ? "<" : ">") + "'))).");
  return type;
}

std::uint32_t little_endian(const std::byte* bytes, int count) {
  std::uint32_t value = 0;
  for (int i = count - 1; i >= 0; --i) value = (value << 8) | std::to_integer<std::uint32_t>(bytes[i]);
  return value;
}

}  // namespace

NpyArray::NpyArray(std::string path)
    : path_(std::move(path)),
      file_(std::make_shared<const detail::MappedFile>(path_, detail::Access::normal, "NpyArray")) {
  const std::byte* bytes = file_->data();
  const std::size_t file_size = file_->size();
  const auto not_npy = [&](const std::string& what) {
    return DataError("NpyArray: " + path_ + " is not a .npy file (" + what + "); write it with np.save.");
  };
  if (file_size < kMagic.size() + 2 || std::memcmp(bytes, kMagic.data(), kMagic.size()) != 0)
    throw not_npy(file_size < kMagic.size() + 2 ? "it has only " + std::to_string(file_size) + " bytes"
                  : file_size >= 4 && std::memcmp(bytes, "PK\x03\x04", 4) == 0
                      ? "it is a zip archive: an .npz from np.savez holds several arrays; np.load it and np.save "
                        "the array you need"
                      : "it does not start with the magic \\x93NUMPY");
  const int major = std::to_integer<int>(bytes[6]), minor = std::to_integer<int>(bytes[7]);
  if (minor != 0 || major < 1 || major > 3)
    throw DataError("NpyArray: " + path_ + " has format version " + std::to_string(major) + "." +
                    std::to_string(minor) + ", which this reader does not know (it reads 1.0, 2.0 and 3.0).");
  const int length_bytes = major == 1 ? 2 : 4;
  const std::size_t preamble = kMagic.size() + 2 + static_cast<std::size_t>(length_bytes);
  if (file_size < preamble) throw not_npy("it ends inside its preamble");
  const std::size_t header_length = little_endian(bytes + kMagic.size() + 2, length_bytes);
  if (header_length > file_size - preamble)
    throw DataError("NpyArray: " + path_ + " is truncated: its header says it is " + std::to_string(header_length) +
                    " bytes long, but the file has " + std::to_string(file_size) + " bytes in all.");
  const std::string_view text(reinterpret_cast<const char*>(bytes + preamble), header_length);
  const Header header = HeaderParser(text, path_).parse();
  dtype_ = checked_dtype(header.descr, path_);
  if (header.fortran_order)
    throw DataError("NpyArray: " + path_ +
                    " is stored in Fortran (column-major) order; samples are mapped as they "
                    "are and need C (row-major) order: save it with np.save(path, np.ascontiguousarray(a)).");
  if (header.shape.empty())
    throw DataError("NpyArray: " + path_ +
                    " holds a 0-d array (shape ()), which has no first dimension to index; "
                    "save an array of samples (e.g. a[None] for one sample).");
  shape_ = header.shape;
  std::int64_t sample_elements = 1, data_bytes = 0;
  bool overflow = false;
  for (std::size_t d = 1; d < shape_.size(); ++d)
    overflow |= __builtin_mul_overflow(sample_elements, shape_[d], &sample_elements);
  overflow |=
      __builtin_mul_overflow(sample_elements, static_cast<std::int64_t>(at::elementSize(dtype_)), &sample_bytes_);
  overflow |= __builtin_mul_overflow(sample_bytes_, shape_[0], &data_bytes);
  data_offset_ = static_cast<std::int64_t>(preamble + header_length);
  const auto present = static_cast<std::int64_t>(file_size) - data_offset_;
  const std::string described = "its header describes shape " + shape_text(shape_) + " of '" + header.descr + "', ";
  if (overflow || data_bytes > present)
    throw DataError("NpyArray: " + path_ + " is truncated: " + described +
                    (overflow ? std::string("more bytes than int64 counts") : std::to_string(data_bytes) + " bytes") +
                    " after the " + std::to_string(data_offset_) + "-byte header, but the file has " +
                    std::to_string(present) + ": it was cut short (an interrupted write or copy?); write it again.");
  if (data_bytes < present)
    throw DataError("NpyArray: " + path_ + " has " + std::to_string(present - data_bytes) +
                    " bytes after its data: " + described + std::to_string(data_bytes) + " bytes after the " +
                    std::to_string(data_offset_) + "-byte header, and the file has " + std::to_string(present) +
                    "; it is not one np.save'd array (np.savez writes a zip: use np.save per array).");
}

at::Tensor NpyArray::get(std::int64_t index) const {
  if (index < 0 || index >= size())
    throw DataError("NpyArray: index " + std::to_string(index) + " is out of range for " + path_ + ", which has " +
                    std::to_string(size()) + " samples (shape " + shape_text(shape_) +
                    "); indices go from 0 to size() - 1.");
  return view(file_->data() + data_offset_ + index * sample_bytes_,
              std::vector<std::int64_t>(shape_.begin() + 1, shape_.end()));
}

at::Tensor NpyArray::tensor() const { return view(file_->data() + data_offset_, shape_); }

at::Tensor NpyArray::view(const void* data, std::vector<std::int64_t> shape) const {
  // from_blob takes a writable pointer; the header says why writing is nonetheless undefined. The
  // deleter's copy of file_ keeps the mapping as long as any tensor made from it.
  return at::from_blob(
      const_cast<void*>(data), shape, [file = file_](void*) {}, at::TensorOptions().dtype(dtype_).device(at::kCPU));
}

}  // namespace fulgur::data
