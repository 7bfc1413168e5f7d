// The zip archive of a checkpoint, checked record by record before LibTorch's reader sees it.
#include <array>
#include <cstring>

#include "src/checkpoint/reading.hpp"

namespace fulgur::checkpoint::reading {
namespace {

constexpr std::size_t kSmallestZip = 22;  // an empty zip is its end-of-central-directory record alone


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

}  // namespace

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

}  // namespace fulgur::checkpoint::reading
