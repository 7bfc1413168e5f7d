// The memory-mapped readers: NpyArray against files NumPy writes at test time, TokenDataset
// against nanoGPT and llm.c token files, and the MappedFile beneath both.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "fulgur/data/npy_array.hpp"
#include "fulgur/data/token_dataset.hpp"
#include "src/data/mapped_file.hpp"
#include "support.hpp"

using fulgur::DataError;
using fulgur::data::NpyArray;
using fulgur::data::TokenDataset;
using fulgur::data::TokenDtype;

namespace {

// Each file's values are a formula of np.arange, recomputed below with at::arange to compare.
constexpr const char* kWriteFiles = R"PY(
import sys, numpy as np, numpy.lib.format as fmt
out = sys.argv[1]
def save(name, a): np.save(f'{out}/{name}.npy', a)
def raw(name, header, data=b'', version=(1, 0)):
    h = header.encode('latin1')
    size = len(h).to_bytes(2 if version[0] == 1 else 4, 'little')
    open(f'{out}/{name}.npy', 'wb').write(b'\x93NUMPY' + bytes(version) + size + h + data)
save('f32', (np.arange(35) * 0.5 - 3).astype(np.float32).reshape(5, 7))
save('images', (np.arange(6 * 3 * 4 * 5) % 251).astype(np.uint8).reshape(6, 3, 4, 5))
save('f16', (np.arange(9) * 0.25 - 1).astype(np.float16))
save('bool', (np.arange(12) % 3 == 0).reshape(4, 3))
save('i64', (np.arange(6, dtype=np.int64) * 1000003 - 2**40).reshape(3, 2))
save('i8', (np.arange(10) - 5).astype(np.int8))
save('i16', (np.arange(10) * -300).astype(np.int16))
save('u16', (np.arange(10) * 6007).astype(np.uint16))
save('i32', (np.arange(10) * -100000 - 7).astype(np.int32))
save('u32', (np.arange(10) * 429496729).astype(np.uint32))
save('u64', np.arange(10, dtype=np.uint64) * 1844674407370955)
save('f64', np.arange(10) / 7)
save('c64', (np.arange(4) + 1j * np.arange(4) * 2).astype(np.complex64))
save('no_rows', np.zeros((0, 3), np.float32))
save('scalar', np.float32(3))
save('fortran', np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
save('big_endian', np.arange(4, dtype='>f4'))
save('strings', np.array(['ab', 'cd']))
save('structured', np.zeros(3, dtype=[('x', '<f4'), ('y', '<i4')]))
save('objects', np.array([1, 'a'], dtype=object))
for major in (2, 3):
    with open(f'{out}/v{major}.npy', 'wb') as f: fmt.write_array(f, np.arange(12, dtype=np.int32).reshape(4, 3), version=(major, 0))
# Double quotes, keys reordered, odd spaces, no trailing comma, a Python 2 long; data at offset 67.
raw('hand', '{"shape":(4L ,) ,  "fortran_order" :False,"descr":"<i4"}\n', np.arange(4, dtype='<i4').tobytes())
raw('duplicate_key', "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,), }\n", bytes(4))
raw('unknown_key', "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}\n", bytes(4))
raw('missing_shape', "{'descr': '<f4', 'fortran_order': False}\n")
raw('version_9', "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }\n", bytes(4), version=(9, 0))
open(f'{out}/header_cut.npy', 'wb').write(b'\x93NUMPY\x01\x00' + (5000).to_bytes(2, 'little') + b"{'descr'")
for name, change in (('truncated', lambda b: b[:-8]), ('trailing', lambda b: b + b'xyz')):
    save(name, np.arange(100, dtype=np.float32))
    data = open(f'{out}/{name}.npy', 'rb').read()
    open(f'{out}/{name}.npy', 'wb').write(change(data))
open(f'{out}/bad_magic.npy', 'wb').write(b'NOTNUMPY' + bytes(100))
open(f'{out}/empty.npy', 'wb').close(); open(f'{out}/empty.bin', 'wb').close()
# Token files: nanoGPT's (raw) and llm.c's (256 int32 header words first).
t16 = (np.arange(1001) * 7 % 65521).astype(np.uint16)
t32 = (np.arange(1001, dtype=np.int64) * 2654435761 % 2**32).astype(np.uint32)
t16.tofile(f'{out}/tokens16.bin'); t32.tofile(f'{out}/tokens32.bin')
t16[:17].tofile(f'{out}/exact17.bin'); t16[:16].tofile(f'{out}/exact16.bin'); t16[:8].tofile(f'{out}/short.bin')
open(f'{out}/odd.bin', 'wb').write(t16[:10].tobytes() + b'\x01')
# llm.c's dev/data/data_common.py: HEADERS_INFO's magic and version per model, write_datafile's layout.
GPT2, LLAMA3 = 20240520, 20240801
def llmc(name, magic, version, tokens, count=None):
    h = np.zeros(256, np.int32); h[0] = magic; h[1] = version; h[2] = len(tokens) if count is None else count
    open(f'{out}/{name}.bin', 'wb').write(h.tobytes() + tokens.tobytes())
llmc('llmc1', GPT2, 1, t16[:17]); llmc('llama3', LLAMA3, 7, t32[:33]); llmc('llmc3', GPT2, 3, t16[:17])
llmc('llmc_count', GPT2, 1, t16[:17], 18); llmc('llmc_negative', GPT2, 1, t16[:17], -10)
llmc('llmc_v2', GPT2, 2, t32[:33]); llmc('llama3_v1', LLAMA3, 1, t16[:17])
open(f'{out}/llmc_cut.bin', 'wb').write(np.array([20240520, 1, 5], np.int32).tobytes())
)PY";

/// The folder of files kWriteFiles wrote, once per test process.
const std::string& files() {
  static const std::string folder = [] {
    const std::string path = test::scratch_folder("data_files");
    std::ofstream(path + "/write_files.py") << kWriteFiles;
    const std::string command = std::string(FULGUR_TEST_PYTHON) + " " + path + "/write_files.py " + path;
    if (std::system(command.c_str()) != 0) throw std::runtime_error("writing the test files failed: " + command);
    return path;
  }();
  return folder;
}
std::string file(const std::string& name) { return files() + "/" + name; }

std::string npy_error(const std::string& name) {
  return test::message_of<DataError>([&] { NpyArray array(file(name + ".npy")); });
}
std::string token_error(const std::string& name, fulgur::data::TokenDatasetOptions options = {}) {
  return test::message_of<DataError>([&] { TokenDataset tokens(file(name + ".bin"), options); });
}

/// The line of /proc/self/maps that maps `path` ("" if none): "start-end perms offset dev inode path".
std::string mapping_of(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.size() > path.size() && line.ends_with(" " + path)) return line;
  return "";
}
bool inside(const void* pointer, const std::string& mapping) {
  std::istringstream fields(mapping);
  std::uintptr_t start = 0, end = 0;
  char dash = 0;
  fields >> std::hex >> start >> dash >> end;
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  return address >= start && address < end;
}
int open_descriptors() {
  int count = 0;
  DIR* dir = ::opendir("/proc/self/fd");
  while (::readdir(dir) != nullptr) ++count;
  ::closedir(dir);
  return count;
}

at::Tensor arange(std::int64_t n, at::ScalarType type = at::kLong) { return at::arange(n, at::TensorOptions(type)); }

}  // namespace

TEST_CASE("data files: NpyArray reads each dtype with the values NumPy wrote", "[data]") {
  const std::vector<std::pair<std::string, at::Tensor>> expected{
      {"f32", (arange(35, at::kDouble) * 0.5 - 3).to(at::kFloat).reshape({5, 7})},
      {"images", (arange(360) % 251).to(at::kByte).reshape({6, 3, 4, 5})},
      {"f16", (arange(9, at::kDouble) * 0.25 - 1).to(at::kHalf)},
      {"bool", (arange(12) % 3 == 0).reshape({4, 3})},
      {"i64", (arange(6) * 1000003 - (std::int64_t{1} << 40)).reshape({3, 2})},
      {"i8", (arange(10) - 5).to(at::kChar)},
      {"i16", (arange(10) * -300).to(at::kShort)},
      {"u16", (arange(10) * 6007).to(at::kUInt16)},
      {"i32", (arange(10) * -100000 - 7).to(at::kInt)},
      {"u32", (arange(10) * 429496729).to(at::kUInt32)},
      {"u64", (arange(10) * 1844674407370955).to(at::kUInt64)},
      {"f64", arange(10, at::kDouble) / 7},
      {"v2", arange(12).to(at::kInt).reshape({4, 3})},
      {"v3", arange(12).to(at::kInt).reshape({4, 3})},
      {"hand", arange(4).to(at::kInt)},
      {"no_rows", at::zeros({0, 3}, at::kFloat)},
  };
  for (const auto& [name, values] : expected) {
    INFO(name);
    const NpyArray array(file(name + ".npy"));
    CHECK(array.dtype() == values.scalar_type());
    CHECK(array.shape() == values.sizes().vec());
    CHECK(array.size() == values.size(0));
    CHECK(array.path() == file(name + ".npy"));
    CHECK(test::identical(array.tensor().to(at::kDouble), values.to(at::kDouble)));
    for (std::int64_t i = 0; i < array.size(); ++i) {
      const at::Tensor sample = array.get(i);
      CHECK(sample.scalar_type() == values.scalar_type());
      CHECK(test::identical(sample.to(at::kDouble), values[i].to(at::kDouble)));
    }
  }
  // Values beyond int64 would not survive the comparison above: check u64's bytes, and c64's halves.
  CHECK(NpyArray(file("u64.npy")).get(9).to(at::kLong).item<std::int64_t>() == 9 * std::int64_t{1844674407370955});
  const NpyArray complex(file("c64.npy"));
  CHECK(complex.dtype() == at::kComplexFloat);
  const at::Tensor halves = at::view_as_real(complex.tensor());
  CHECK(torch::equal(halves.select(1, 0), arange(4, at::kFloat)));
  CHECK(torch::equal(halves.select(1, 1), arange(4, at::kFloat) * 2));
  CHECK(NpyArray(file("hand.npy")).data_offset() == 67);     // misaligned for int32, read correctly above
  CHECK(NpyArray(file("f32.npy")).data_offset() % 64 == 0);  // NumPy pads its headers to 64 bytes
}

TEST_CASE("data files: NpyArray samples are views into the read-only mapping", "[data]") {
  const std::string path = file("images.npy");
  const int descriptors = open_descriptors();
  const NpyArray images(path);
  CHECK(open_descriptors() == descriptors);  // the mapping holds no file descriptor
  const std::string mapping = mapping_of(path);
  REQUIRE_FALSE(mapping.empty());
  CHECK(mapping.find(" r--s ") != std::string::npos);  // read-only, shared with the page cache
  const at::Tensor whole = images.tensor();
  CHECK(inside(whole.data_ptr(), mapping));
  const std::int64_t sample_bytes = 3 * 4 * 5;
  for (std::int64_t i = 0; i < images.size(); ++i) {
    const at::Tensor sample = images.get(i);
    CHECK(sample.sizes() == at::IntArrayRef{3, 4, 5});
    CHECK(sample.is_contiguous());
    CHECK(sample.data_ptr() == static_cast<std::byte*>(whole.data_ptr()) + i * sample_bytes);
    CHECK(inside(sample.data_ptr(), mapping));
  }
  CHECK(images.get(2).data_ptr() == images.get(2).data_ptr());
}

namespace {
/// Runs `crash` in a child process: its exit status and what it wrote on stderr.
template <class F>
std::pair<int, std::string> in_child(F&& crash) {
  int pipe_ends[2];
  REQUIRE(::pipe(pipe_ends) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::dup2(pipe_ends[1], STDERR_FILENO);
    ::close(pipe_ends[0]);
    crash();
    ::_exit(0);
  }
  ::close(pipe_ends[1]);
  std::string said;
  char buffer[512];
  for (ssize_t n; (n = ::read(pipe_ends[0], buffer, sizeof buffer)) > 0;) said.append(buffer, static_cast<std::size_t>(n));
  ::close(pipe_ends[0]);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  return {status, said};
}

bool crashed(int status) {  // SIGSEGV; under ASan, its own report and a failing exit code
  return WIFSIGNALED(status) ? WTERMSIG(status) == SIGSEGV : WEXITSTATUS(status) != 0;
}
}  // namespace

TEST_CASE("data files: a sample written in place ends the process with a message naming the file and the fix (probe)",
          "[data]") {
  // Found by the new-user probe: x.sub_(mean) on a sample was a bare "Segmentation fault" (the mapping is read-only).
  const std::string path = file("f32.npy");
  const auto [status, said] = in_child([&] {
    const NpyArray array(path);
    array.get(0).add_(1);  // faults
  });
  INFO(said);
  CHECK(crashed(status));  // still a crash, now with the cause and the fix said first
  CHECK_THAT(said, Catch::Contains("fulgur: a tensor that views NpyArray's read-only memory map of " + path +
                                   " was written in place") &&
                       Catch::Contains("auto x = array.get(i).clone(); x.sub_(mean);"));
  // A fault elsewhere (here: a SIGSEGV raised, at no address) is not blamed on a mapping.
  const auto [other_status, other_said] = in_child([&] {
    const NpyArray array(path);
    ::raise(SIGSEGV);
  });
  CHECK(crashed(other_status));
  CHECK(other_said.find("fulgur:") == std::string::npos);
}

TEST_CASE("data files: a tensor from NpyArray keeps the mapping alive after the array is gone", "[data]") {
  const std::string path = file("f32.npy");
  at::Tensor kept;
  {
    const NpyArray array(path);
    kept = array.get(3);
  }
  CHECK(!mapping_of(path).empty());
  CHECK(torch::equal(kept, (arange(35, at::kDouble) * 0.5 - 3).to(at::kFloat).reshape({5, 7})[3]));
  kept.reset();
  CHECK(mapping_of(path).empty());  // the last view gone, the file is unmapped
}

TEST_CASE("data files: NpyArray refuses what it cannot map and says why", "[data]") {
  using Catch::Contains;
  CHECK_THAT(npy_error("scalar"), Contains("0-d array") && Contains("has no first dimension to index"));
  CHECK_THAT(npy_error("fortran"), Contains("Fortran") && Contains("np.ascontiguousarray"));
  CHECK_THAT(npy_error("big_endian"), Contains("big-endian ('>f4')") && Contains("newbyteorder('<')"));
  CHECK_THAT(npy_error("strings"), Contains("'<U2'") && Contains("supported: |b1 |u1"));
  CHECK_THAT(npy_error("objects"), Contains("'|O'") && Contains("Python objects"));
  CHECK_THAT(npy_error("structured"), Contains("structured (record) array"));
  CHECK_THAT(npy_error("truncated"), Contains("is truncated") && Contains("400 bytes") && Contains("has 392"));
  CHECK_THAT(npy_error("trailing"), Contains("3 bytes after its data") && Contains("400 bytes"));
  CHECK_THAT(npy_error("header_cut"), Contains("is truncated: its header says it is 5000 bytes long"));
  CHECK_THAT(npy_error("bad_magic"), Contains("is not a .npy file") && Contains("magic"));
  CHECK_THAT(npy_error("empty"), Contains("is not a .npy file (it has only 0 bytes)"));
  CHECK_THAT(npy_error("version_9"), Contains("format version 9.0"));
  CHECK_THAT(npy_error("duplicate_key"), Contains("malformed header: a second 'descr' key at character 25 of `{") &&
                                             Contains("(1,), }`; write the file with np.save"));
  CHECK_THAT(npy_error("unknown_key"), Contains("unknown key 'extra'"));
  CHECK_THAT(npy_error("missing_shape"), Contains("no 'shape' key"));
  const std::string missing = file("missing.npy");
  CHECK_THAT(npy_error("missing"), Contains("NpyArray: cannot open " + missing + ": No such file or directory"));
  CHECK_THAT(test::message_of<DataError>([&] { NpyArray array(files()); }), Contains("is not a regular file"));
  for (const std::string name : {"scalar", "fortran", "truncated", "bad_magic"})
    CHECK_THAT(npy_error(name), Contains(file(name + ".npy")));
}

TEST_CASE("data files: NpyArray get refuses an index out of range", "[data]") {
  const NpyArray array(file("f32.npy"));
  for (const std::int64_t index : {std::int64_t{5}, std::int64_t{-1}, std::int64_t{1} << 40})
    CHECK_THAT(test::message_of<DataError>([&] { (void)array.get(index); }),
               Catch::Contains("index " + std::to_string(index) + " is out of range") &&
                   Catch::Contains("which has 5 samples (shape (5, 7))"));
  CHECK_THAT(test::message_of<DataError>([] { (void)NpyArray(file("no_rows.npy")).get(0); }),
             Catch::Contains("has 0 samples"));
}

TEST_CASE("data files: TokenDataset windows of a nanoGPT file, target shifted by one", "[data]") {
  const at::Tensor tokens16 = arange(1001) * 7 % 65521, tokens32 = arange(1001) * 2654435761 % (std::int64_t{1} << 32);
  for (const auto& [name, dtype, tokens] :
       {std::tuple{"tokens16", TokenDtype::uint16, tokens16}, std::tuple{"tokens32", TokenDtype::uint32, tokens32}}) {
    INFO(name);
    const TokenDataset dataset(file(std::string(name) + ".bin"), {.context = 8, .dtype = dtype});
    CHECK(dataset.num_tokens() == 1001);
    CHECK(dataset.size() == 125);
    CHECK(dataset.context() == 8);
    CHECK(dataset.dtype() == dtype);
    CHECK_FALSE(dataset.has_llmc_header());
    for (const std::int64_t i : {std::int64_t{0}, std::int64_t{1}, std::int64_t{61}, std::int64_t{124}}) {
      const fulgur::data::Batch window = dataset.get(i);
      CHECK(window.input.scalar_type() == at::kLong);
      CHECK(window.input.sizes() == at::IntArrayRef{8});
      CHECK(torch::equal(window.input, tokens.slice(0, i * 8, i * 8 + 8)));
      CHECK(torch::equal(window.target, tokens.slice(0, i * 8 + 1, i * 8 + 9)));
    }
  }
  CHECK(tokens32.max().item<std::int64_t>() > 65535);  // uint32 values past uint16's range came through
  const TokenDataset defaults(file("tokens16.bin"));
  CHECK(defaults.context() == 256);
  CHECK(defaults.dtype() == TokenDtype::uint16);
  CHECK(defaults.size() == 3);
  // The last window needs its shifted target: 17 tokens make 2 windows of 8, 16 tokens only 1.
  CHECK(TokenDataset(file("exact17.bin"), {.context = 8}).size() == 2);
  CHECK(torch::equal(TokenDataset(file("exact17.bin"), {.context = 8}).get(1).target, tokens16.slice(0, 9, 17)));
  CHECK(TokenDataset(file("exact16.bin"), {.context = 8}).size() == 1);
  CHECK(TokenDataset(file("short.bin"), {.context = 7}).size() == 1);
}

TEST_CASE("data files: TokenDataset with a stride: overlapping windows, every position with stride 1", "[data]") {
  const at::Tensor tokens = arange(1001) * 7 % 65521;
  const TokenDataset every(file("tokens16.bin"), {.context = 8, .stride = 1});
  CHECK(every.stride() == 1);
  CHECK(every.size() == 993);  // starts 0..992: the last window's target ends at token 1000
  for (const std::int64_t i : {std::int64_t{0}, std::int64_t{5}, std::int64_t{992}}) {
    CHECK(torch::equal(every.get(i).input, tokens.slice(0, i, i + 8)));
    CHECK(torch::equal(every.get(i).target, tokens.slice(0, i + 1, i + 9)));
  }
  const std::vector<std::int64_t> rows{992, 3};
  CHECK(torch::equal(every.get_batch(rows).target[0], tokens.slice(0, 993, 1001)));
  const TokenDataset thirds(file("tokens16.bin"), {.context = 8, .stride = 3});
  CHECK(thirds.size() == 331);  // starts 0, 3, ..., 990
  CHECK(torch::equal(thirds.get(330).input, tokens.slice(0, 990, 998)));
  CHECK_THAT(test::message_of<DataError>([&] { (void)thirds.get(331); }),
             Catch::Contains("331 windows of 8 tokens (stride 3)"));
  CHECK(TokenDataset(file("tokens16.bin"), {.context = 8}).stride() == 8);  // 0: the context
  CHECK(TokenDataset(file("exact16.bin"), {.context = 8, .stride = 100}).size() == 1);
  CHECK_THAT(token_error("tokens16", {.context = 8, .stride = -1}), Catch::Contains("stride must be at least 1 token"));
}

TEST_CASE("data files: TokenDataset get_batch stacks the windows get returns", "[data]") {
  const TokenDataset dataset(file("tokens32.bin"), {.context = 16, .dtype = TokenDtype::uint32});
  const std::vector<std::int64_t> indices{3, 0, 61, 3};
  const fulgur::data::Batch batch = dataset.get_batch(indices);
  CHECK(batch.input.sizes() == at::IntArrayRef{4, 16});
  CHECK(batch.target.sizes() == at::IntArrayRef{4, 16});
  CHECK(batch.input.scalar_type() == at::kLong);
  for (std::size_t row = 0; row < indices.size(); ++row) {
    const fulgur::data::Batch window = dataset.get(indices[row]);
    CHECK(torch::equal(batch.input[static_cast<std::int64_t>(row)], window.input));
    CHECK(torch::equal(batch.target[static_cast<std::int64_t>(row)], window.target));
  }
  CHECK(dataset.get_batch({}).input.sizes() == at::IntArrayRef{0, 16});
  const std::vector<std::int64_t> bad{0, 62};
  CHECK_THAT(test::message_of<DataError>([&] { (void)dataset.get_batch(bad); }),
             Catch::Contains("index 62 is out of range") && Catch::Contains("62 windows of 16 tokens"));
}

TEST_CASE("data files: TokenDataset reads llm.c's header and lets it decide the dtype", "[data]") {
  const TokenDataset v1(file("llmc1.bin"), {.context = 4, .dtype = TokenDtype::uint32});
  CHECK(v1.has_llmc_header());
  CHECK(v1.dtype() == TokenDtype::uint16);  // the header wins over the options
  CHECK(v1.num_tokens() == 17);
  CHECK(v1.size() == 4);
  CHECK(torch::equal(v1.get(3).input, (arange(1001) * 7 % 65521).slice(0, 12, 16)));
  CHECK(torch::equal(v1.get(3).target, (arange(1001) * 7 % 65521).slice(0, 13, 17)));
  // Llama 3's files (llm.c's "llama-3": magic 20240801, version 7, uint32 tokens): the probe found
  // them read as raw uint16 tokens, header words included.
  const TokenDataset llama3(file("llama3.bin"), {.context = 32});
  CHECK(llama3.has_llmc_header());
  CHECK(llama3.dtype() == TokenDtype::uint32);
  CHECK(llama3.num_tokens() == 33);
  CHECK(llama3.size() == 1);
  CHECK(torch::equal(llama3.get(0).input, (arange(1001) * 2654435761 % (std::int64_t{1} << 32)).slice(0, 0, 32)));
  CHECK(torch::equal(llama3.get(0).target, (arange(1001) * 2654435761 % (std::int64_t{1} << 32)).slice(0, 1, 33)));
}

TEST_CASE("data files: TokenDataset refuses what it cannot read and says why", "[data]") {
  using Catch::Contains;
  CHECK_THAT(token_error("missing"),
             Contains("TokenDataset: cannot open " + file("missing.bin") + ": No such file or directory"));
  CHECK_THAT(token_error("odd"), Contains(file("odd.bin")) && Contains("has 21 bytes, not a multiple of 2") &&
                                     Contains("truncated or is not a token file"));
  CHECK_THAT(
      token_error("tokens16", {.dtype = TokenDtype::uint32}),
      Contains("not a multiple of 4 (the size of a uint32 token)") && Contains("pass .dtype = TokenDtype::uint16"));
  CHECK_THAT(token_error("tokens16", {.context = 0}), Contains("context must be at least 1 token, got 0"));
  CHECK_THAT(token_error("tokens16", {.context = -3}), Contains("got -3"));
  CHECK_THAT(token_error("short", {.context = 8}),
             Contains("has 8 uint16 tokens, too few for one window") && Contains("context + 1 = 9 tokens"));
  CHECK_THAT(token_error("empty"), Contains("has 0 uint16 tokens"));
  CHECK_THAT(token_error("llmc3"), Contains("llm.c's header (magic 20240520, gpt-2) with version 3") &&
                                       Contains("where llm.c writes version 1 (uint16 tokens)"));
  CHECK_THAT(token_error("llmc_v2"), Contains("(magic 20240520, gpt-2) with version 2"));  // no such format
  CHECK_THAT(token_error("llama3_v1"), Contains("(magic 20240801, llama-3) with version 1") &&
                                           Contains("where llm.c writes version 7 (uint32 tokens)"));
  CHECK_THAT(token_error("llmc_negative"), Contains("saying -10 tokens, a negative count"));
  CHECK_THAT(token_error("llmc_count"),
             Contains("header saying 18 uint16 tokens (36 bytes") && Contains("the file has 34 bytes after it"));
  CHECK_THAT(token_error("llmc_cut"), Contains("fewer than llm.c's 1024-byte header"));
  // A NumPy file (np.save rather than tofile): its header is not tokens (the probe found it read as such).
  for (const char* npy : {"u16.npy", "hand.npy", "v2.npy"})
    CHECK_THAT(test::message_of<DataError>([&] { TokenDataset tokens(file(npy), {.context = 2}); }),
               Contains("TokenDataset: " + file(npy) + " is a NumPy .npy file (np.save)") &&
                   Contains("tofile(path)), or read the file with fulgur::data::NpyArray"));
  const TokenDataset dataset(file("exact17.bin"), {.context = 8});
  for (const std::int64_t index : {std::int64_t{2}, std::int64_t{-1}})
    CHECK_THAT(test::message_of<DataError>([&] { (void)dataset.get(index); }),
               Contains("index " + std::to_string(index) + " is out of range for " + file("exact17.bin")) &&
                   Contains("has 2 windows of 8 tokens"));
}

TEST_CASE("data files: MappedFile maps whole files, an empty one without mmap", "[data]") {
  using fulgur::data::detail::Access;
  using fulgur::data::detail::MappedFile;
  MappedFile tokens(file("tokens16.bin"), Access::random);
  CHECK(tokens.size() == 2002);
  CHECK(tokens.path() == file("tokens16.bin"));
  std::uint16_t second = 0;
  std::memcpy(&second, tokens.data() + 2, sizeof second);
  CHECK(second == 7);
  tokens.advise(Access::sequential);  // a hint only: nothing to observe but that reads still work
  const std::byte* data = tokens.data();
  MappedFile moved(std::move(tokens));
  CHECK(moved.data() == data);
  CHECK(moved.size() == 2002);
  const MappedFile empty(file("empty.npy"));
  CHECK(empty.data() == nullptr);
  CHECK(empty.size() == 0);
  moved = MappedFile(file("empty.npy"));
  CHECK(mapping_of(file("tokens16.bin")).empty());  // the move assignment unmapped the old file
  CHECK_THAT(test::message_of<DataError>([] { MappedFile missing(file("nothing")); }),
             Catch::Contains("fulgur: cannot open " + file("nothing") + ": No such file or directory"));
}
