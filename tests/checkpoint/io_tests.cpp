// Checkpoint file I/O when things go wrong: every bad file is a fulgur::CheckpointError that names the
// file, what is wrong and what to do, and changes nothing on disk; hostile files that crash LibTorch's
// own reader are refused first; a writer SIGKILLed at any moment leaves the previous or the new
// checkpoint, never a broken one; a full or unwritable disk leaves the previous checkpoint intact.
#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/detail/files.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/state_dict.hpp"

// After LibTorch: c10 defines a glog-style CHECK that must not replace Catch's.
#include <catch2/catch.hpp>

#include "support.hpp"


namespace {

using checkpoint_tests::TempFolder;
using checkpoint_tests::checkpoint_error;

using Bytes = std::vector<char>;
using fulgur::StateDict;
namespace checkpoint = fulgur::checkpoint;


Bytes read_file(const std::string& path) {
  Bytes out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buffer[65536];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) out.insert(out.end(), buffer, buffer + n);
  ::close(fd);
  return out;
}

void write_file(const std::string& path, const Bytes& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::write(fd, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  ::close(fd);
}
void write_file(const std::string& path, const std::string& text) { write_file(path, Bytes(text.begin(), text.end())); }

std::vector<std::string> entries(const std::string& folder) {
  std::vector<std::string> out;
  if (DIR* dir = ::opendir(folder.c_str())) {
    while (const dirent* e = ::readdir(dir))
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) out.push_back(e->d_name);
    ::closedir(dir);
  }
  std::sort(out.begin(), out.end());
  return out;
}

/// Every entry of a folder with its size, modification time and bytes.
std::string snapshot(const std::string& folder) {
  std::string out;
  for (const std::string& name : entries(folder)) {
    struct stat info {};
    ::lstat((folder + "/" + name).c_str(), &info);
    const Bytes bytes = S_ISREG(info.st_mode) ? read_file(folder + "/" + name) : Bytes{};
    out += name + " " + std::to_string(info.st_mode) + " " + std::to_string(info.st_size) + " " +
           std::to_string(info.st_mtim.tv_sec) + "." + std::to_string(info.st_mtim.tv_nsec) + " " +
           std::to_string(std::hash<std::string>{}(std::string(bytes.begin(), bytes.end()))) + "\n";
  }
  return out;
}

/// The message of the fulgur::CheckpointError that f throws (a test failure for any other outcome).

c10::impl::GenericDict dict() { return c10::impl::GenericDict(c10::StringType::get(), c10::AnyType::get()); }

/// Nested dicts, a list, tensors of several dtypes, ints, doubles and strings.
StateDict rich_state() {
  auto inner = dict();
  inner.insert("steps", at::arange(5, at::kLong));
  inner.insert("note", std::string("inner"));
  auto model = dict();
  model.insert("weight", at::arange(600, at::kFloat).reshape({20, 30}));
  model.insert("bias", at::linspace(-1, 1, 30, at::kDouble));
  model.insert("half", at::ones({7}, at::kHalf));
  model.insert("mask", at::arange(9) % 2 == 0);
  model.insert("inner", inner);
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(int64_t{1});
  list.push_back(0.25);
  list.push_back(std::string("two"));
  list.push_back(at::arange(3, at::kInt));
  StateDict state;
  state.insert("model", model);
  state.insert("list", list);
  state.insert("epoch", int64_t{3});
  state.insert("lr", 0.01);
  state.insert("name", std::string("rich"));
  return state;
}

void check_rich(const StateDict& s) {
  REQUIRE(s.size() == 5);
  const auto model = s.at("model").toGenericDict();
  CHECK(at::equal(model.at("weight").toTensor(), at::arange(600, at::kFloat).reshape({20, 30})));
  CHECK(at::equal(model.at("bias").toTensor(), at::linspace(-1, 1, 30, at::kDouble)));
  CHECK(model.at("half").toTensor().scalar_type() == at::kHalf);
  CHECK(model.at("inner").toGenericDict().at("note").toStringRef() == "inner");
  CHECK(s.at("list").toListRef().at(2).toStringRef() == "two");
  CHECK(s.at("epoch").toInt() == 3);
  CHECK(s.at("lr").toDouble() == 0.01);
}

/// A zip as LibTorch writes it ("archive/<name>" records, its version records), holding these records.
Bytes zip_of(const std::vector<std::pair<std::string, std::string>>& records) {
  Bytes out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* b, std::size_t n) {
    out.insert(out.end(), static_cast<const char*>(b), static_cast<const char*>(b) + n);
    return n;
  });
  for (const auto& [name, data] : records) writer.writeRecord(name, data.data(), data.size());
  writer.writeEndOfFile();
  return out;
}

std::string le32(std::int64_t v) {
  std::string s(4, '\0');
  for (std::size_t i = 0; i < 4; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}
std::string binint(std::int64_t v) { return "J" + le32(v); }
std::string str(const std::string& s) { return "X" + le32(static_cast<std::int64_t>(s.size())) + s; }

/// {"t": tensor} as Python's torch.save pickles it: a float storage of `numel` elements in record
/// data/0, viewed with this offset, size and stride.
std::string tensor_pickle(std::int64_t numel, std::int64_t offset, std::int64_t size, std::int64_t stride,
                          const std::string& element_type = "ctorch\nFloatStorage\n") {
  return std::string("\x80\x02}", 3) + str("t") + "ctorch._utils\n_rebuild_tensor_v2\n(" + "(" + str("storage") +
         element_type + str("0") + str("cpu") + binint(numel) + "tQ" + binint(offset) + binint(size) +
         "\x85" + binint(stride) + "\x85\x89" + "ccollections\nOrderedDict\n)R" + "tRs.";
}
std::string floats(std::int64_t n) {
  const at::Tensor t = at::arange(n, at::kFloat);
  return std::string(static_cast<const char*>(t.data_ptr()), static_cast<std::size_t>(n * 4));
}

/// A dict of one value, written as raw pickle opcodes.
std::string dict_with(const std::string& value) { return std::string("\x80\x02}", 3) + str("k") + value + "s."; }

}  // namespace

// ---- bad files -------------------------------------------------------------------------------

TEST_CASE("a zero-length file is refused, naming the file", "[load]") {
  TempFolder tmp("fulgur-io");
  write_file(tmp / "empty.ckpt", Bytes{});
  const std::string m = checkpoint_error([&] { checkpoint::load(tmp / "empty.ckpt"); });
  CHECK_THAT(m, Catch::Contains(tmp / "empty.ckpt") && Catch::Contains("is empty (0 bytes)") &&
                    Catch::Contains("Resume from an earlier checkpoint"));
}

TEST_CASE("a checkpoint cut at any offset is refused as truncated, and the file is left as it is", "[load]") {
  TempFolder tmp("fulgur-io");
  const Bytes whole = checkpoint::to_bytes(rich_state());
  check_rich(checkpoint::from_bytes(whole));
  const std::string path = tmp / "cut.ckpt";
  std::size_t truncated = 0;
  for (std::size_t cut = 0; cut < whole.size(); ++cut) {
    const Bytes part(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(cut));
    const std::string m = checkpoint_error([&] { checkpoint::from_bytes(part, "checkpoint '" + path + "'"); });
    INFO("cut at " << cut << " of " << whole.size() << ": " << m);
    REQUIRE_THAT(m, Catch::Contains(path));
    if (cut >= 22) REQUIRE_THAT(m, Catch::Contains("is truncated (" + std::to_string(cut) + " bytes)") &&
                                       Catch::Contains("copy it again"));
    truncated += m.find("truncated") != std::string::npos;
  }
  // Through load() too, at a few offsets, and the file is not touched.
  for (const std::size_t cut : {whole.size() / 3, whole.size() / 2, whole.size() - 1}) {
    write_file(path, Bytes(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(cut)));
    const std::string before = snapshot(tmp.path);
    CHECK_THAT(checkpoint_error([&] { checkpoint::load(path); }), Catch::Contains("is truncated"));
    CHECK(snapshot(tmp.path) == before);
  }
  std::printf("checkpoint cut at all %zu offsets: all refused (%zu as truncated)\n", whole.size(), truncated);
}

TEST_CASE("random bytes, a text file and a legacy torch.save file are refused", "[load]") {
  std::mt19937_64 rng(20240611);
  for (int i = 0; i < 300; ++i) {
    Bytes b(1 + rng() % 4096);
    for (char& c : b) c = static_cast<char>(rng());
    if (i % 2 == 0 && b.size() >= 4) std::memcpy(b.data(), "PK\x03\x04", 4);  // past the magic check
    INFO("random input " << i << " of " << b.size() << " bytes");
    CHECK_THAT(checkpoint_error([&] { checkpoint::from_bytes(b, "checkpoint 'random.ckpt'"); }),
               Catch::Contains("checkpoint 'random.ckpt' is"));
  }
  TempFolder tmp("fulgur-io");
  write_file(tmp / "notes.txt", std::string("epoch,loss\n1,0.5\n"));
  CHECK_THAT(checkpoint_error([&] { checkpoint::load(tmp / "notes.txt"); }),
             Catch::Contains(tmp / "notes.txt") && Catch::Contains("is a text file (it begins \"epoch,loss\")") &&
                 Catch::Contains("torch.save"));
  // torch.save(..., _use_new_zipfile_serialization=False): a pickle of the magic number first.
  write_file(tmp / "legacy.pt", std::string("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.\x80\x02M\xe9\x03.", 20));
  CHECK_THAT(checkpoint_error([&] { checkpoint::load(tmp / "legacy.pt"); }),
             Catch::Contains(tmp / "legacy.pt") && Catch::Contains("legacy torch.save file") &&
                 Catch::Contains("re-save it in Python"));
  write_file(tmp / "zeros.ckpt", Bytes(5000, '\0'));
  CHECK_THAT(checkpoint_error([&] { checkpoint::load(tmp / "zeros.ckpt"); }), Catch::Contains("bytes are zero"));
  write_file(tmp / "binary.bin", std::string("\x7f" "ELF\x02\x01\x01\x00\x00", 9));
  CHECK_THAT(checkpoint_error([&] { checkpoint::load(tmp / "binary.bin"); }),
             Catch::Contains("it begins with the bytes 7f 45 4c 46"));
}

TEST_CASE("a directory, a missing file, a FIFO and a device are refused without waiting", "[load]") {
  TempFolder tmp("fulgur-io");
  ::mkdir((tmp / "folder").c_str(), 0755);
  CHECK_THAT(checkpoint_error([&] { checkpoint::load(tmp / "folder"); }),
             Catch::Contains(tmp / "folder") && Catch::Contains("is a directory") && Catch::Contains("/last.ckpt"));
  CHECK_THAT(checkpoint_error([&] { checkpoint::load(tmp / "missing.ckpt"); }),
             Catch::Contains("cannot open checkpoint '" + tmp / "missing.ckpt" + "': No such file or directory") &&
                 Catch::Contains("Check the path"));
  CHECK_THAT(checkpoint_error([&] { checkpoint::load("/dev/null"); }), Catch::Contains("not a regular file"));
  // Opening a FIFO for reading waits for a writer: load must not.
  REQUIRE(::mkfifo((tmp / "fifo").c_str(), 0644) == 0);
  auto loading = std::async(std::launch::async, [&] { return checkpoint_error([&] { checkpoint::load(tmp / "fifo"); }); });
  if (loading.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    const int unblock = ::open((tmp / "fifo").c_str(), O_WRONLY | O_NONBLOCK);
    loading.wait();
    ::close(unblock);
    FAIL("load() of a FIFO waited for a writer");
  }
  CHECK_THAT(loading.get(), Catch::Contains("not a regular file"));
}

TEST_CASE("a zip that does not hold a dictionary of tensors, numbers and strings is refused", "[load]") {
  c10::impl::GenericList list(c10::IntType::get());
  list.push_back(1);
  CHECK_THAT(checkpoint_error([&] { checkpoint::from_bytes(torch::jit::pickle_save(list), "checkpoint 'list.pt'"); }),
             Catch::Contains("checkpoint 'list.pt' is not a checkpoint: it holds a GenericList, not a dictionary"));
  CHECK_THAT(checkpoint_error([&] { checkpoint::from_bytes(zip_of({{"notes.txt", "hello"}}), "checkpoint 'a.zip'"); }),
             Catch::Contains("a zip archive without the data.pkl"));
  const std::string object = std::string("\x80\x02", 2) + "c__main__\nNet\n)\x81}b.";
  CHECK_THAT(checkpoint_error([&] { checkpoint::from_bytes(zip_of({{"data.pkl", object}}), "checkpoint 'net.pt'"); }),
             Catch::Contains("checkpoint 'net.pt' holds pickled Python objects") &&
                 Catch::Contains("__main__.Net (the whole file)"));
  const std::string int_key = std::string("\x80\x02}K\x01K\x02s.", 9);
  CHECK_THAT(checkpoint_error([&] { checkpoint::from_bytes(zip_of({{"data.pkl", int_key}}), "checkpoint 'k.pt'"); }),
             Catch::Contains("non-string key"));
}

TEST_CASE("a tensor whose storage or view reaches past its record is refused, not read out of bounds", "[load][hostile]") {
  const auto load = [](std::int64_t numel, std::int64_t offset, std::int64_t size, std::int64_t stride) {
    return checkpoint::from_bytes(zip_of({{"data.pkl", tensor_pickle(numel, offset, size, stride)}, {"data/0", floats(1000)}}),
                                  "checkpoint 'forged.ckpt'");
  };
  // The hand-made pickle is what torch.save writes: as written, it loads.
  CHECK(at::equal(load(1000, 0, 1000, 1).at("t").toTensor(), at::arange(1000, at::kFloat)));
  CHECK(at::equal(load(1000, 10, 495, 2).at("t").toTensor(), at::arange(10, 1000, 2, at::kFloat)));
  // LibTorch sizes the storage by the pickle's count and the view by its size, stride and offset.
  CHECK_THAT(checkpoint_error([&] { load(1'000'000, 0, 1000, 1); }),
             Catch::Contains("checkpoint 'forged.ckpt' is corrupt: its data.pkl holds a storage of 1000000 Float "
                             "elements (4000000 bytes) in record 'data/0', which holds 4000 bytes"));
  CHECK_THAT(checkpoint_error([&] { load(1000, 10, 1000, 1); }), Catch::Contains("reaches past its storage"));
  CHECK_THAT(checkpoint_error([&] { load(1000, 0, 2000, 1); }), Catch::Contains("reaches past its storage"));
  CHECK_THAT(checkpoint_error([&] { load(1000, 0, 1000, 3); }), Catch::Contains("reaches past its storage"));
  CHECK_THAT(checkpoint_error([&] { load(1000, 999, 1000, -1); }), Catch::Contains("checkpoint 'forged.ckpt' is corrupt"));
  CHECK_THAT(checkpoint_error([&] { load(1000, -1, 10, 1); }), Catch::Contains("checkpoint 'forged.ckpt' is"));
  // The element type as a number: LibTorch indexes its type tables with it unchecked.
  const auto typed = [](const std::string& element_type) {
    return checkpoint_error([&] {
      checkpoint::from_bytes(zip_of({{"data.pkl", tensor_pickle(1000, 0, 1000, 1, element_type)}, {"data/0", floats(1000)}}),
                             "checkpoint 'forged.ckpt'");
    });
  };
  CHECK_THAT(typed(binint(200)), Catch::Contains("holds a storage of unknown element type 200"));
  CHECK_THAT(typed(binint(-1)), Catch::Contains("holds a storage of unknown element type -1"));
  // A quantized element type without _rebuild_qtensor's parameters: every use of it fails.
  CHECK_THAT(typed(binint(static_cast<int>(at::kQInt8))), Catch::Contains("is quantized but has no quantization parameters"));
  CHECK(at::equal(checkpoint::from_bytes(zip_of({{"data.pkl", tensor_pickle(1000, 0, 1000, 1, binint(static_cast<int>(at::kFloat)))},
                                                 {"data/0", floats(1000)}}))
                      .at("t")
                      .toTensor(),
                  at::arange(1000, at::kFloat)));
}

TEST_CASE("hostile pickles that crash LibTorch's unpickler are refused first", "[load][hostile]") {
  const auto error = [](const std::string& pickle) {
    return checkpoint_error([&] { checkpoint::from_bytes(zip_of({{"data.pkl", pickle}}), "checkpoint 'hostile.ckpt'"); });
  };
  // A million nested tuples in 1 MB: LibTorch frees them recursively and overflows the stack (SIGSEGV).
  CHECK_THAT(error(dict_with("N" + std::string(1'000'000, '\x85'))),
             Catch::Contains("checkpoint 'hostile.ckpt' is corrupt: its data.pkl nests containers more than 1000 deep"));
  // The same, failing halfway (LibTorch frees them while unwinding).
  CHECK_THAT(error(std::string("\x80\x02N", 3) + std::string(1'000'000, '\x85') + "Q."), Catch::Contains("deep"));
  // Lists nested through the memo, 6 bytes a level.
  std::string lists = "]q\x01";
  for (int i = 0; i < 200'000; ++i) lists += std::string("]h\x01" "aq\x01", 6);
  CHECK_THAT(error(dict_with(lists)), Catch::Contains("deep"));
  // Nesting a state dict can have loads.
  CHECK(checkpoint::from_bytes(zip_of({{"data.pkl", dict_with("N" + std::string(500, '\x85'))}})).size() == 1);
  // A list or dict that holds itself: every recursive walk of it (printing, saving it again) never ends.
  CHECK_THAT(error(dict_with(std::string("]q\x02h\x02" "a", 6))), Catch::Contains("contains itself"));
  CHECK_THAT(error(std::string("\x80\x02}q\x00", 5) + str("k") + std::string("h\x00s.", 4)), Catch::Contains("contains itself"));
  // A call of _rebuild_from_type_v2 before the global it calls is read (LibTorch indexes past its table).
  CHECK_THAT(error(dict_with("ctorch._tensor\n_rebuild_from_type_v2\n(NNN}tR")), Catch::Contains("tensor subclass"));
  CHECK_THAT(checkpoint_error([&] { checkpoint::from_bytes(zip_of({{"data.pkl", dict_with("ctorch._utils\n_rebuild_sparse_tensor\n")}})); }),
             Catch::Contains("torch._utils._rebuild_sparse_tensor at 'k'"));
  CHECK_THAT(error(dict_with("]e")), Catch::Contains("has a MARK that does not match"));
}

TEST_CASE("forged lengths and memo indices are refused before LibTorch allocates them", "[load][hostile]") {
  const auto peak = [] {
    rusage usage{};
    ::getrusage(RUSAGE_SELF, &usage);
    return usage.ru_maxrss * 1024L;
  };
  const long before = peak();
  const auto error = [](const std::string& pickle) {
    return checkpoint_error([&] { checkpoint::from_bytes(zip_of({{"data.pkl", pickle}}), "checkpoint 'forged.ckpt'"); });
  };
  CHECK_THAT(error(dict_with(std::string("X\xff\xff\xff\x7f", 5) + "abc")), Catch::Contains("longer than the rest of the file"));
  CHECK_THAT(error(dict_with(std::string("\x8d\x00\x00\x00\x00\x04\x00\x00\x00", 9))), Catch::Contains("longer than the rest"));
  CHECK_THAT(error(dict_with(std::string("Nr\xff\xff\xff\x0f", 6))), Catch::Contains("memo entry far beyond"));
  // A zip record that says it holds 4 GB.
  Bytes zip = checkpoint::to_bytes(rich_state());
  const std::size_t directory = zip.size() - 22 - 20 - 56;  // to_bytes ends with a zip64 end record, locator, end record
  REQUIRE(std::memcmp(zip.data() + directory, "PK\x06\x06", 4) == 0);
  const std::size_t first_entry = [&] {
    std::uint64_t at = 0;
    std::memcpy(&at, zip.data() + directory + 48, 8);
    return static_cast<std::size_t>(at);
  }();
  std::memcpy(zip.data() + first_entry + 24, "\xfe\xff\xff\xff", 4);  // uncompressed size
  CHECK_THAT(checkpoint_error([&] { checkpoint::from_bytes(zip, "checkpoint 'forged.ckpt'"); }),
             Catch::Contains("says it holds 4294967294"));
  CHECK(peak() - before < 512L * 1024 * 1024);
}

TEST_CASE("a flipped bit anywhere in a checkpoint is caught, by the CRC-32 where nothing else notices", "[load]") {
  const Bytes whole = checkpoint::to_bytes(rich_state());
  std::size_t loaded = 0;
  for (std::size_t at = 0; at < whole.size(); ++at) {
    Bytes b = whole;
    b[at] ^= 0x10;
    try {
      const StateDict s = checkpoint::from_bytes(b);  // a bit in a field nobody reads (a timestamp, padding)
      if (!at::equal(s.at("model").toGenericDict().at("weight").toTensor(), at::arange(600, at::kFloat).reshape({20, 30})))
        FAIL("bit flipped in byte " << at << " loads with other weights");
      check_rich(s);
      ++loaded;
    } catch (const fulgur::CheckpointError&) {
    } catch (const std::exception& e) {
      FAIL("flipping a bit of byte " << at << ": not a CheckpointError: " << e.what());
    }
  }
  // The weights: a flipped bit in a float loads silently through LibTorch alone.
  const at::Tensor w = at::arange(600, at::kFloat);
  const float seven = 7.0f;
  Bytes b = whole;
  const auto it = std::search(b.begin(), b.end(), reinterpret_cast<const char*>(&seven), reinterpret_cast<const char*>(&seven) + 4);
  REQUIRE(it != b.end());
  it[3] ^= 0x40;
  CHECK_THAT(checkpoint_error([&] { checkpoint::from_bytes(b, "checkpoint 'x'"); }),
             Catch::Contains("record 'archive/data/") && Catch::Contains("fails its CRC-32 check"));
  std::printf("one bit flipped at each of %zu bytes: %zu still load (bits nobody reads), the rest are refused\n", whole.size(), loaded);
}

TEST_CASE("a record marked as a folder is refused: LibTorch would hand back an uninitialized buffer", "[load][hostile]") {
  // miniz skips the bytes of a record whose DOS attributes say "directory" (bit 0x10), and LibTorch
  // returns the buffer it allocated for them as the tensor's data.
  Bytes b = checkpoint::to_bytes(rich_state());
  const std::string_view central_header = "PK\x01\x02";
  const auto entry = std::search(b.begin(), b.end(), central_header.begin(), central_header.end());
  REQUIRE(entry != b.end());
  entry[38] |= 0x10;
  CHECK_THAT(checkpoint_error([&] { checkpoint::from_bytes(b, "checkpoint 'folder-bit.ckpt'"); }),
             Catch::Contains("record 'archive/data/0' is marked as a folder"));
}

TEST_CASE("a file larger than this machine's memory is refused, not allocated", "[load]") {
  TempFolder tmp("fulgur-io");
  const std::string path = tmp / "huge.ckpt";
  const long long memory = static_cast<long long>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  const bool sparse = ::ftruncate(fd, memory + (1LL << 30)) == 0;  // sparse: no disk space
  ::close(fd);
  if (!sparse) {
    checkpoint_tests::skip("this file system cannot hold a sparse file larger than memory");
    return;
  }
  CHECK_THAT(checkpoint_error([&] { checkpoint::load(path); }),
             Catch::Contains(path) && Catch::Contains("does not fit in this machine's memory"));
}

TEST_CASE("nothing on disk changes when a load fails", "[load]") {
  TempFolder tmp("fulgur-io");
  const Bytes whole = checkpoint::to_bytes(rich_state());
  write_file(tmp / "cut.ckpt", Bytes(whole.begin(), whole.begin() + 1000));
  write_file(tmp / "empty.ckpt", Bytes{});
  write_file(tmp / "text.ckpt", std::string("not a checkpoint\n"));
  Bytes flipped = whole;
  flipped[whole.size() / 2] ^= 1;
  write_file(tmp / "flipped.ckpt", flipped);
  ::mkdir((tmp / "folder.ckpt").c_str(), 0755);
  write_file(tmp / "good.ckpt", whole);
  const std::string before = snapshot(tmp.path);
  for (const char* name : {"cut.ckpt", "empty.ckpt", "text.ckpt", "flipped.ckpt", "folder.ckpt", "missing.ckpt"})
    checkpoint_error([&] { checkpoint::load(tmp / name); });
  check_rich(checkpoint::load(tmp / "good.ckpt"));
  CHECK(snapshot(tmp.path) == before);
}

TEST_CASE("what Python's torch.save writes still loads", "[load]") {
  const std::string python = FULGUR_TEST_PYTHON;
  if (python.empty() || ::access(python.c_str(), X_OK) != 0) {
    checkpoint_tests::skip("no Python to write a torch.save file with");
    return;
  }
  TempFolder tmp("fulgur-io");
  const std::string script = R"(
import collections, sys, torch
t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
net = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
attributed = torch.arange(6.0)
attributed.note = "a Python attribute"
per_channel = torch.quantize_per_channel(torch.tensor([[0.5, 1.0], [2.0, 0.0]]), torch.tensor([0.5, 0.25], dtype=torch.float64),
                                         torch.tensor([0, 1]), 0, torch.quint8)
dtypes = [torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.bool]
torch.save({
    "weight": t, "column": t[:, 1], "transposed": t.t(), "rows": t[1:], "again": t,
    "dtypes": {str(d): torch.arange(6).to(d) for d in dtypes},
    "scalar": torch.tensor(2.5), "empty": torch.empty(0, 5),
    "one": [1], "list": [1, 2.5, "x", None, True, -7], "tuple": (1, "a"),
    "nested": {"a": {"b": {"c": [torch.ones(2)]}}},
    "many": {"k%d" % i: i for i in range(1500)},
    "tensors": [torch.full((2,), float(i)) for i in range(300)],
    "module": net.state_dict(), "parameter": torch.nn.Parameter(torch.arange(4.0)), "attributed": attributed,
    "float8": torch.arange(4.0).to(torch.float8_e4m3fn), "uint16": torch.arange(5).to(torch.uint16),
    "ints": [2**33, -2**40, 2**63 - 1, -2**63, 255, -1], "complex": 1.5 - 2j,
    "devices": [torch.device("cuda", 1), torch.device("cpu")], "ordered": collections.OrderedDict(a=1, b=2),
    "quantized": torch.quantize_per_tensor(torch.tensor([0.5, 1.0, -2.0]), 0.5, 3, torch.qint8),
    "per_channel": per_channel, "conjugate": torch.tensor([1 + 2j, -3j]).conj(),
}, sys.argv[1])
)";
  write_file(tmp / "make.py", script);
  const std::string command = "'" + python + "' '" + tmp / "make.py" + "' '" + tmp / "python.pt" + "'";
  REQUIRE(std::system(command.c_str()) == 0);
  const StateDict s = checkpoint::load(tmp / "python.pt");
  const at::Tensor t = at::arange(12, at::kFloat).reshape({3, 4});
  CHECK(at::equal(s.at("weight").toTensor(), t));
  CHECK(at::equal(s.at("column").toTensor(), t.select(1, 1)));
  CHECK(at::equal(s.at("transposed").toTensor(), t.t()));
  CHECK(at::equal(s.at("rows").toTensor(), t.slice(0, 1)));
  CHECK(s.at("dtypes").toGenericDict().size() == 9);
  CHECK(s.at("scalar").toTensor().item<double>() == 2.5);
  CHECK(s.at("one").toListRef().size() == 1);
  CHECK(s.at("list").toListRef().at(5).toInt() == -7);
  CHECK(s.at("many").toGenericDict().size() == 1500);
  CHECK(s.at("tensors").toListRef().at(299).toTensor()[1].item<float>() == 299.0f);
  // A module's state_dict is an OrderedDict with attributes (_metadata); parameters, tensors with Python
  // attributes and dtypes without a typed storage (_rebuild_tensor_v3) are tensors; ints as Python writes them.
  const StateDict module(s.at("module").toGenericDict());
  CHECK(module.size() == 7);
  CHECK(module.at("0.weight").toTensor().sizes() == at::IntArrayRef({2, 3}));
  CHECK(module.at("1.num_batches_tracked").toTensor().scalar_type() == at::kLong);
  CHECK(at::equal(s.at("parameter").toTensor(), at::arange(4, at::kFloat)));
  CHECK(at::equal(s.at("attributed").toTensor(), at::arange(6, at::kFloat)));
  CHECK(s.at("float8").toTensor().scalar_type() == at::kFloat8_e4m3fn);
  CHECK(at::equal(s.at("float8").toTensor().to(at::kFloat), at::arange(4, at::kFloat)));
  CHECK(s.at("uint16").toTensor().scalar_type() == at::kUInt16);
  CHECK(at::equal(s.at("uint16").toTensor().to(at::kLong), at::arange(5, at::kLong)));
  const auto ints = s.at("ints").toListRef();
  CHECK(ints.at(0).toInt() == (std::int64_t{1} << 33));
  CHECK(ints.at(1).toInt() == -(std::int64_t{1} << 40));
  CHECK(ints.at(2).toInt() == std::numeric_limits<std::int64_t>::max());
  CHECK(ints.at(3).toInt() == std::numeric_limits<std::int64_t>::min());
  CHECK(ints.at(4).toInt() == 255);
  CHECK(ints.at(5).toInt() == -1);
  CHECK(s.at("complex").toComplexDouble() == c10::complex<double>(1.5, -2.0));
  CHECK(s.at("devices").toListRef().at(0).toDevice() == c10::Device("cuda:1"));
  CHECK(s.at("devices").toListRef().at(1).toDevice() == c10::Device("cpu"));
  CHECK(s.at("ordered").toGenericDict().at("b").toInt() == 2);
  const at::Tensor q = s.at("quantized").toTensor();
  CHECK(q.qscheme() == at::kPerTensorAffine);
  CHECK(q.q_scale() == 0.5);
  CHECK(q.q_zero_point() == 3);
  CHECK(at::equal(q.dequantize(), at::tensor({0.5f, 1.0f, -2.0f})));
  const at::Tensor pc = s.at("per_channel").toTensor();
  CHECK(pc.qscheme() == at::kPerChannelAffine);
  CHECK(at::equal(pc.dequantize(), at::tensor({0.5f, 1.0f, 2.0f, 0.0f}).reshape({2, 2})));
  const at::Tensor conjugate = s.at("conjugate").toTensor();
  CHECK(conjugate.is_conj());
  CHECK(at::equal(conjugate.resolve_conj(), at::tensor({c10::complex<float>(1, -2), c10::complex<float>(0, 3)})));
}

TEST_CASE("LibTorch's type-tagged pickles (torch::pickle_save) still load", "[load]") {
  check_rich(checkpoint::from_bytes(torch::jit::pickle_save(rich_state().to_ivalue())));
}

namespace {
/// A pickle of a dict: key -> value for each pair (raw opcodes).
std::string dict_of(const std::vector<std::pair<std::string, std::string>>& items) {
  std::string p = std::string("\x80\x02}(", 4);
  for (const auto& [key, value] : items) p += str(key) + value;
  return p + "u.";
}
StateDict dict_at(const StateDict& s, const std::string& key) { return StateDict(s.at(key).toGenericDict()); }
const checkpoint::LoadOptions as_dicts{.python_objects = checkpoint::PythonObjects::as_dicts};
}  // namespace

TEST_CASE("pickled Python objects are refused by default, each named with where it is, and read as dictionaries "
          "when asked, never run",
          "[load][python]") {
  // What Python's pickler writes for each (protocol 2).
  const std::string pickle = dict_of({
      {"path", "cpathlib\nPosixPath\n(" + str("/") + str("data") + "tR"},           // (cls, args) REDUCE
      {"color", "c__main__\nColor\n" + str("red") + "\x85R"},                        // an Enum member
      {"config", "cargparse\nNamespace\n)\x81}" + str("seed") + "K\x07sb"},           // NEWOBJ, then BUILD's state
      {"hparams", "cattr\nDict\n)\x81(" + str("a") + "K\x01u"},                      // a dict subclass: SETITEMS
      {"items", "cmylib\nItems\n)\x81(K\x01K\x02" "e"},                                 // a list subclass: APPENDS
      {"function", "cbuiltins\nprint\n"},                                            // a reference, not called
      {"set", "c__builtin__\nset\n](K\x01K\x02" "e\x85R"},                               // Python 2's module name
      {"plain", "K\x05"},
  });
  const std::string refused =
      checkpoint_error([&] { checkpoint::from_bytes(zip_of({{"data.pkl", pickle}}), "checkpoint 'objects.ckpt'"); });
  CHECK_THAT(refused, Catch::Contains("checkpoint 'objects.ckpt' holds pickled Python objects, which have no C++ form: "
                                      "pathlib.PosixPath at 'path', __main__.Color at 'color', argparse.Namespace at "
                                      "'config', attr.Dict at 'hparams', mylib.Items at 'items', builtins.print at "
                                      "'function', and 1 more.") &&
                          Catch::Contains("never runs anything") &&
                          Catch::Contains("LoadOptions{.python_objects = fulgur::checkpoint::PythonObjects::as_dicts}"));

  const StateDict s = checkpoint::from_bytes(zip_of({{"data.pkl", pickle}}), "objects", as_dicts);
  CHECK(s.at("plain").toInt() == 5);
  const StateDict path = dict_at(s, "path");
  CHECK(path.at("__python__").toStringRef() == "pathlib.PosixPath");
  CHECK(path.at("args").toTupleRef().elements().at(1).toStringRef() == "data");
  CHECK(dict_at(s, "color").at("args").toTupleRef().elements().at(0).toStringRef() == "red");
  const StateDict config = dict_at(s, "config");
  CHECK(config.at("__python__").toStringRef() == "argparse.Namespace");
  CHECK(config.at("args").toTupleRef().elements().empty());
  CHECK(config.at("state").toGenericDict().at("seed").toInt() == 7);
  CHECK(dict_at(s, "hparams").at("items").toGenericDict().at("a").toInt() == 1);
  CHECK(dict_at(s, "items").at("list").toListRef().size() == 2);
  const StateDict function = dict_at(s, "function");
  CHECK(function.size() == 1);
  CHECK(function.at("__python__").toStringRef() == "builtins.print");
  CHECK(dict_at(s, "set").at("__python__").toStringRef() == "builtins.set");
  CHECK(dict_at(s, "set").at("args").toTupleRef().elements().at(0).toListRef().size() == 2);
  // Saved again, they are plain dictionaries.
  CHECK(dict_at(checkpoint::from_bytes(checkpoint::to_bytes(s)), "config").at("state").toGenericDict().at("seed").toInt() == 7);

  // The pickle is checked as before, objects included: one that holds itself, one nested too deep, a
  // dictionary keyed by one, a state set on something that is not an object.
  const auto error = [](const std::string& p) {
    return checkpoint_error([&] { checkpoint::from_bytes(zip_of({{"data.pkl", p}}), "checkpoint 'hostile.ckpt'", as_dicts); });
  };
  CHECK_THAT(error(dict_with("cmod\nObj\n)\x81q\x01}" + str("self") + "h\x01sb")), Catch::Contains("contains itself"));
  std::string nested = "cmod\nO\nq\x01";
  for (int i = 0; i < 599; ++i) nested += "h\x01";
  nested += "N";
  for (int i = 0; i < 600; ++i) nested += "\x85R";
  CHECK_THAT(error(dict_with(nested)), Catch::Contains("nests containers more than 1000 deep"));
  CHECK_THAT(error(std::string("\x80\x02}", 3) + "cmod\nColor\n" + str("red") + "\x85RK\x01s."),
             Catch::Contains("holds a dictionary keyed by Python objects (mod.Color)"));
  CHECK_THAT(error(dict_with("}}b")), Catch::Contains("sets the state of something that is not a Python object"));
  CHECK_THAT(error(dict_with("Nb")), Catch::Contains("sets the state of something that is not a Python object"));
  CHECK_THAT(error(dict_with("N)\x81")), Catch::Contains("creates an instance of something that is not a class"));
}

// ---- crash safety ------------------------------------------------------------------------------

namespace {
/// Two payloads a few MB each; every save holds one, its sum and a count, so a load can tell whether
/// what it read is exactly one completed save.
struct Payloads {
  at::Tensor a = at::arange(1 << 20, at::kFloat).mul_(0.5);          // 4 MB
  at::Tensor b = at::arange(3 << 19, at::kLong).remainder_(65521);     // 12 MB
  double sum_a = a.sum(at::kDouble).item<double>(), sum_b = b.sum(at::kDouble).item<double>();
  StateDict state(std::int64_t count) const {  // no tensor arithmetic: fork-safe
    const bool first = count % 2 == 0;
    StateDict s;
    s.insert("count", count);
    s.insert("kind", std::string(first ? "a" : "b"));
    s.insert("payload", first ? a : b);
    s.insert("sum", first ? sum_a : sum_b);
    return s;
  }
  /// The save's count, after checking that the payload is exactly the one it names.
  std::int64_t check(const StateDict& s) const {
    const bool first = s.at("kind").toStringRef() == "a";
    const at::Tensor& payload = s.at("payload").toTensor();
    REQUIRE(at::equal(payload, first ? a : b));
    REQUIRE(payload.sum(at::kDouble).item<double>() == s.at("sum").toDouble());
    REQUIRE((s.at("count").toInt() % 2 == 0) == first);
    return s.at("count").toInt();
  }
};

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}
}  // namespace

TEST_CASE("a writer SIGKILLed at any moment of a save leaves a complete checkpoint", "[save][kill]") {
  const Payloads payloads;
  TempFolder tmp("fulgur-io");
  const std::string path = tmp / "last.ckpt";
  const int trials = env_int("FULGUR_CHECKPOINT_KILL_TRIALS", 60);
  const unsigned seed = static_cast<unsigned>(env_int("FULGUR_CHECKPOINT_KILL_SEED", 12345));
  const auto t0 = std::chrono::steady_clock::now();
  checkpoint::save(path, payloads.state(1));
  checkpoint::save(path, payloads.state(2));
  const double save_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 2;
  auto* completed = static_cast<std::atomic<std::int64_t>*>(
      ::mmap(nullptr, sizeof(std::atomic<std::int64_t>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(completed != MAP_FAILED);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> delay(0.0, 3.0 * save_seconds);  // the kill lands in saves 1 to 3
  std::int64_t previous = payloads.check(checkpoint::load(path));
  std::set<pid_t> killed;
  int kept_previous = 0, mid_write = 0;
  for (int trial = 0; trial < trials; ++trial) {
    const std::int64_t base = (trial + 1) * 1'000'000LL;
    completed->store(0);
    const pid_t writer = ::fork();
    REQUIRE(writer >= 0);
    if (writer == 0) {
      for (std::int64_t count = base;; ++count) {
        checkpoint::save(path, payloads.state(count));
        completed->store(count);
      }
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(delay(rng)));
    ::kill(writer, SIGKILL);
    ::waitpid(writer, nullptr, 0);
    killed.insert(writer);
    INFO("trial " << trial << ", writer " << writer << ", last completed save " << completed->load());
    StateDict state;
    REQUIRE_NOTHROW(state = checkpoint::load(path));
    const std::int64_t count = payloads.check(state);
    const std::int64_t done = completed->load();
    // The previous trial's last save, or one of this writer's: at most the one it was killed after renaming.
    if (count == previous) {
      ++kept_previous;
    } else {
      CHECK(count >= base);
      CHECK(count <= std::max(done, base - 1) + 1);
    }
    previous = count;
    for (const std::string& name : entries(tmp.path)) {
      if (name == "last.ckpt") continue;
      const std::string prefix = ".last.ckpt.tmp.";
      REQUIRE(name.rfind(prefix, 0) == 0);  // only a killed writer's temporary file
      REQUIRE(killed.count(static_cast<pid_t>(std::stol(name.substr(prefix.size())))) == 1);
      mid_write += static_cast<pid_t>(std::stol(name.substr(prefix.size()))) == writer;
    }
  }
  // A save removes what killed writers left; and a normal save leaves nothing else.
  checkpoint::save(path, payloads.state(7));
  CHECK(entries(tmp.path) == std::vector<std::string>{"last.ckpt"});
  CHECK(payloads.check(checkpoint::load(path)) == 7);
  ::munmap(completed, sizeof(std::atomic<std::int64_t>));
  std::printf("SIGKILL trials: %d (seed %u, one save %.1f ms, kills within 0-%.1f ms): all left a complete checkpoint; "
              "%d killed mid-write (temporary file left), %d before any save completed\n",
              trials, seed, save_seconds * 1e3, 3e3 * save_seconds, mid_write, kept_previous);
}

TEST_CASE("many saves leave no temporary files, and stale ones of dead writers are removed but live ones kept", "[save]") {
  const Payloads payloads;
  TempFolder tmp("fulgur-io");
  for (int i = 0; i < 40; ++i) checkpoint::save(tmp / "model.ckpt", payloads.state(i));
  CHECK(entries(tmp.path) == std::vector<std::string>{"model.ckpt"});
  CHECK(payloads.check(checkpoint::load(tmp / "model.ckpt")) == 39);

  const pid_t dead = ::fork();
  if (dead == 0) ::_exit(0);
  ::waitpid(dead, nullptr, 0);
  write_file(tmp / (".model.ckpt.tmp." + std::to_string(dead)), std::string("half a save"));
  // A live writer: a process that holds the lock on its temporary file.
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const std::string live_file = tmp / ".model.ckpt.tmp.999999";  // no such pid: only its lock says it is alive
  const pid_t live = ::fork();
  if (live == 0) {
    const int fd = ::open(live_file.c_str(), O_WRONLY | O_CREAT, 0644);
    ::flock(fd, LOCK_EX);
    (void)!::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  char x;
  REQUIRE(::read(ready[0], &x, 1) == 1);
  write_file(tmp / ".other.ckpt.tmp.1", std::string("another file's"));
  write_file(tmp / ".model.ckpt.tmp.notapid", std::string("not ours"));
  checkpoint::save(tmp / "model.ckpt", payloads.state(40));
  ::kill(live, SIGKILL);
  ::waitpid(live, nullptr, 0);
  ::close(ready[0]), ::close(ready[1]);
  const std::vector<std::string> kept{".model.ckpt.tmp.999999", ".model.ckpt.tmp.notapid", ".other.ckpt.tmp.1", "model.ckpt"};
  CHECK(entries(tmp.path) == kept);
}

TEST_CASE("threads saving one path at once never leave a broken checkpoint", "[save]") {
  const Payloads payloads;
  TempFolder tmp("fulgur-io");
  const std::string path = tmp / "shared.ckpt";
  checkpoint::save(path, payloads.state(0));
  std::atomic<bool> stop{false};
  std::atomic<int> broken{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < 2; ++w)
    writers.emplace_back([&, w] {
      for (int i = 0; i < 15; ++i) {
        try {
          checkpoint::save(path, payloads.state(2 * i + w));
        } catch (const std::exception&) {
          ++broken;
        }
      }
    });
  std::thread reader([&] {
    while (!stop) {
      try {
        const StateDict s = checkpoint::load(path);
        if (!at::equal(s.at("payload").toTensor(), s.at("kind").toStringRef() == "a" ? payloads.a : payloads.b)) ++broken;
      } catch (const std::exception&) {
        ++broken;
      }
    }
  });
  for (auto& t : writers) t.join();
  stop = true;
  reader.join();
  CHECK(broken == 0);
  payloads.check(checkpoint::load(path));
  CHECK(entries(tmp.path) == std::vector<std::string>{"shared.ckpt"});
}

// ---- full or unwritable disks ------------------------------------------------------------------

TEST_CASE("a save into an unwritable folder throws and keeps the previous checkpoint", "[save][disk]") {
  const Payloads payloads;
  TempFolder tmp("fulgur-io");
  const std::string folder = tmp / "ro";
  ::mkdir(folder.c_str(), 0755);
  const std::string path = folder + "/last.ckpt";
  checkpoint::save(path, payloads.state(4));
  const Bytes before = read_file(path);
  // chmod stops everyone but root; as root, the immutable flag (chattr +i) does.
  std::string how;
  int dir_fd = -1;
  if (::geteuid() != 0) {
    ::chmod(folder.c_str(), 0555);
    how = "chmod 0555";
  } else {
    dir_fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY);
    int flags = 0;
    if (dir_fd >= 0 && ::ioctl(dir_fd, FS_IOC_GETFLAGS, &flags) == 0) {
      flags |= FS_IMMUTABLE_FL;
      if (::ioctl(dir_fd, FS_IOC_SETFLAGS, &flags) == 0) how = "the immutable flag (chattr +i, as root)";
    }
  }
  const auto restore = [&] {
    ::chmod(folder.c_str(), 0755);
    int flags = 0;
    if (dir_fd >= 0 && ::ioctl(dir_fd, FS_IOC_GETFLAGS, &flags) == 0) {
      flags &= ~FS_IMMUTABLE_FL;
      ::ioctl(dir_fd, FS_IOC_SETFLAGS, &flags);
    }
    if (dir_fd >= 0) ::close(dir_fd);
  };
  const int probe = ::open((folder + "/probe").c_str(), O_WRONLY | O_CREAT, 0644);
  if (probe >= 0 || how.empty()) {
    if (probe >= 0) ::close(probe), ::unlink((folder + "/probe").c_str());
    restore();
    checkpoint_tests::skip("cannot make a folder unwritable here (root, and the file system has no immutable flag)");
    return;
  }
  const std::string m = checkpoint_error([&] { checkpoint::save(path, payloads.state(5)); });
  const auto after = entries(folder);
  const Bytes kept = read_file(path);
  restore();
  CHECK_THAT(m, Catch::Contains("cannot save checkpoint '" + path + "': cannot create '" + folder + "/.last.ckpt.tmp.") &&
                    Catch::Contains("a checkpoint already at the destination is intact"));
  CHECK(after == std::vector<std::string>{"last.ckpt"});
  CHECK(kept == before);
  CHECK(payloads.check(checkpoint::load(path)) == 4);
  std::printf("unwritable folder made with %s: save threw CheckpointError, previous checkpoint intact\n", how.c_str());
}

TEST_CASE("a save onto a directory, or under a file, throws and changes nothing", "[save][disk]") {
  const Payloads payloads;
  TempFolder tmp("fulgur-io");
  ::mkdir((tmp / "dir.ckpt").c_str(), 0755);
  write_file(tmp / "dir.ckpt/inside", std::string("x"));
  // A folder at the path is named as one, with the fix (not free space and permissions: the new-user probe).
  const std::string onto_folder = checkpoint_error([&] { checkpoint::save(tmp / "dir.ckpt", payloads.state(0)); });
  CHECK_THAT(onto_folder, Catch::Contains("cannot save checkpoint '" + tmp / "dir.ckpt" + "': it is a folder; give the "
                                          "path of a file (e.g. '" + tmp / "dir.ckpt/last.ckpt" + "')"));
  CHECK_THAT(onto_folder, !Catch::Contains("Free space") && !Catch::Contains("permissions"));
  CHECK(entries(tmp.path) == std::vector<std::string>{"dir.ckpt"});
  CHECK(entries(tmp / "dir.ckpt") == std::vector<std::string>{"inside"});
  write_file(tmp / "file", std::string("x"));
  CHECK_THAT(checkpoint_error([&] { checkpoint::save(tmp / "file/sub/last.ckpt", payloads.state(0)); }),
             Catch::Contains("while saving '" + tmp / "file/sub/last.ckpt" + "'; nothing was written"));
}

TEST_CASE("a save cut short by a file size limit throws and keeps the previous checkpoint", "[save][disk]") {
  const Payloads payloads;
  TempFolder tmp("fulgur-io");
  const std::string path = tmp / "last.ckpt";
  checkpoint::save(path, payloads.state(0));
  const Bytes before = read_file(path);
  rlimit old{};
  ::getrlimit(RLIMIT_FSIZE, &old);
  const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG
  rlimit small = old;
  small.rlim_cur = 1 << 20;
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string m;
  try {
    checkpoint::save(path, payloads.state(1));
  } catch (const fulgur::CheckpointError& e) {
    m = e.what();
  } catch (...) {
    m = "another exception";
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  CHECK_THAT(m, Catch::Contains("cannot save checkpoint '" + path + "': cannot write") && Catch::Contains("File too large") &&
                    Catch::Contains("intact"));
  CHECK(entries(tmp.path) == std::vector<std::string>{"last.ckpt"});
  CHECK(read_file(path) == before);
  CHECK(payloads.check(checkpoint::load(path)) == 0);
}

TEST_CASE("a save onto a full disk (a small tmpfs) throws and keeps the previous checkpoint", "[save][disk]") {
  // In a child with its own mount namespace, so that the tmpfs goes away with it. The child does no
  // tensor arithmetic (LibTorch's thread pool does not survive fork).
  const Payloads payloads;
  int result[2];
  REQUIRE(::pipe(result) == 0);
  TempFolder tmp("fulgur-io");
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(result[0]);
    const auto report = [&](const std::string& text) {
      (void)!::write(result[1], text.data(), text.size());
      ::_exit(0);
    };
    if (::unshare(CLONE_NEWNS) != 0 || ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", tmp.path.c_str(), "tmpfs", 0, "size=10m") != 0)
      report(std::string("skip: cannot mount a tmpfs here: ") + std::strerror(errno));
    try {
      const std::string path = tmp / "last.ckpt";
      checkpoint::save(path, payloads.state(0));  // 4 MB fits in 10 MB; 12 MB does not
      const Bytes before = read_file(path);
      std::string m;
      try {
        checkpoint::save(path, payloads.state(1));
        report("fail: the save onto a full tmpfs did not throw");
      } catch (const fulgur::CheckpointError& e) {
        m = e.what();
      }
      if (m.find("No space left on device") == std::string::npos || m.find("cannot save checkpoint '" + path + "'") == std::string::npos)
        report("fail: unexpected message: " + m);
      if (entries(tmp.path) != std::vector<std::string>{"last.ckpt"}) report("fail: the temporary file was left behind");
      if (read_file(path) != before || checkpoint::load(path).at("count").toInt() != 0)
        report("fail: the previous checkpoint changed");
      checkpoint::save(path, payloads.state(2));  // the space is free again
      report(checkpoint::load(path).at("count").toInt() == 2 ? "ok: " + m : "fail: the next save did not land");
    } catch (const std::exception& e) {
      report(std::string("fail: ") + e.what());
    }
  }
  ::close(result[1]);
  std::string text;
  char buffer[4096];
  for (ssize_t n; (n = ::read(result[0], buffer, sizeof buffer)) > 0;) text.append(buffer, static_cast<std::size_t>(n));
  ::close(result[0]);
  ::waitpid(child, nullptr, 0);
  if (text.rfind("skip: ", 0) == 0) {
    checkpoint_tests::skip(text.substr(6));
    return;
  }
  INFO(text);
  CHECK(text.rfind("ok: ", 0) == 0);
  std::printf("full tmpfs (10 MB): %s\n", text.c_str());
}
