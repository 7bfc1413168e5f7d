// A seeded mutation fuzzer for the readers of outside input other than the checkpoint (which
// tests/checkpoint/fuzz.cpp covers): the .npy reader (fulgur::data::NpyArray), the token-file reader
// (fulgur::data::TokenDataset) and the YAML / command-line config loader (fulgur::cli). Every input must
// be read or refused with fulgur's own error — no crash, hang, abort or other exception.
//
//   fulgur_reader_fuzz <npy|tokens|cli> <seconds> <seed>
//   fulgur_reader_fuzz <npy|tokens|cli> --replay <file>...
//   fulgur_reader_fuzz <npy|tokens|cli> --write-seeds <folder>   (a corpus for the libFuzzer targets)
//
// npy: valid .npy files (versions 1.0-3.0, every dtype the reader takes, 0-d to 4-d shapes) mutated in
// their bytes and in their header's text (dtype, shape digits, keys, quotes, padding, the header's
// length). A file that loads must hold exactly the bytes its header describes, and every sample is read.
// tokens: the first byte chooses the options (context, stride, dtype), the rest is the file: plain
// uint16 / uint32 tokens or llm.c's headered files, mutated (the magic, version and count words too).
// What loads must give windows whose target is the input shifted by one, for the first and last window.
// cli: a YAML config applied to the real root schema of a CLI program (trainer keys, callbacks, loggers,
// model and data groups), mutated with YAML's syntax (anchors, aliases, tags, merges, flow and block
// nesting) and with the schema's keys; or (inputs starting with "args\n") a command line, one argument
// per line. A config that resolves must print as YAML that resolves again to the same text, and be read
// into TrainerConfig and the callbacks it names; otherwise it must be a ConfigError (or another
// MisconfigurationError from a callback's own checks).
//
// Input n of seed s is the same on every run. Batches run in a forked child (fork_batch_driver.hpp); a
// crash or hang is counted, its input written to <target>-fuzz-<seed>-<n>.bin (in $FULGUR_FUZZ_ARTIFACTS
// or the current folder), and the run goes on; the exit code is 1 if any input failed. Built with
// FULGUR_LIBFUZZER=<1|2|3> it is instead the libFuzzer target for npy, tokens or cli.
#include <sys/mman.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fulgur/cli.hpp"
#include "fulgur/data/npy_array.hpp"
#include "fulgur/data/token_dataset.hpp"
#include "fulgur/errors.hpp"
#include "tests/cli/tiny.hpp"
#include "tests/fuzz/fork_batch_driver.hpp"
#include "tests/fuzz/rng.hpp"

namespace {

using Bytes = std::string;

using fuzzing::Rng;

std::size_t at_most(std::size_t a, std::size_t b) { return std::min(a, b); }

void put_le(Bytes& b, std::size_t at, std::size_t width, std::uint64_t v) {
  for (std::size_t i = 0; i < width && at + i < b.size(); ++i) b[at + i] = static_cast<char>(v >> (8 * i));
}

std::uint64_t interesting(Rng& rng, std::uint64_t original) {
  static const std::uint64_t values[] = {0, 1, 2, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, ~0ull,
                                         0x7FFFFFFFFFFFFFFFull, 20240520, 20240801};
  switch (rng.below(4)) {
    case 0: return original + 1;
    case 1: return original - 1;
    case 2: return rng.next();
    default: return values[rng.below(std::size(values))];
  }
}

/// Bit flips, overwritten bytes and integers, truncation, chunks duplicated, removed or inserted.
void byte_mutation(Bytes& b, Rng& rng) {
  const std::size_t n = b.size();
  if (n == 0) {
    b.push_back(static_cast<char>(rng.next()));
    return;
  }
  switch (rng.below(8)) {
    case 0: b[rng.below(n)] ^= static_cast<char>(1u << rng.below(8)); break;
    case 1:
      for (std::size_t k = 0, at = rng.below(n), count = 1 + rng.below(8); k < count && at + k < n; ++k)
        b[at + k] = static_cast<char>(rng.next());
      break;
    case 2: {
      const std::size_t width = std::size_t{1} << rng.below(4), at = rng.below(n);
      std::uint64_t v = 0;
      for (std::size_t i = width; i-- > 0;) v = v << 8 | (at + i < n ? static_cast<unsigned char>(b[at + i]) : 0u);
      put_le(b, at, width, interesting(rng, v));
    } break;
    case 3: b.resize(rng.below(n)); break;
    case 4: {
      const std::size_t at = rng.below(n), len = 1 + rng.below(at_most(n - at, 256));
      b.insert(rng.below(n + 1), b.substr(at, len));
    } break;
    case 5: {
      const std::size_t at = rng.below(n);
      b.erase(at, 1 + rng.below(at_most(n - at, 256)));
    } break;
    case 6: {
      Bytes chunk(1 + rng.below(32), '\0');
      for (char& c : chunk) c = static_cast<char>(rng.next());
      b.insert(rng.below(n + 1), chunk);
    } break;
    default: b.resize(n - at_most(n, 1 + rng.below(16))); break;
  }
}

/// A word from `dictionary` inserted or written over the text at a random place.
void token_mutation(Bytes& b, Rng& rng, const std::vector<std::string>& dictionary) {
  const std::string& word = dictionary[rng.below(dictionary.size())];
  const std::size_t at = rng.below(b.size() + 1);
  if (rng.one_in(2)) b.insert(at, word);
  else b.replace(at, at_most(word.size(), b.size() - at), word);
}

// ---- npy ------------------------------------------------------------------------------------------

Bytes npy_file(int major, const std::string& descr, const std::vector<std::int64_t>& shape, std::size_t item_size,
               bool fortran = false) {
  std::string dims;
  std::int64_t count = 1;
  for (std::size_t i = 0; i < shape.size(); ++i) dims += (i ? ", " : "") + std::to_string(shape[i]), count *= shape[i];
  if (shape.size() == 1) dims += ",";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") + ", 'shape': (" +
                       dims + "), }";
  const std::size_t preamble = major == 1 ? 10 : 12;
  header.append(63 - (preamble + header.size()) % 64, ' ');
  header += '\n';
  Bytes out = std::string("\x93NUMPY", 6) + static_cast<char>(major) + '\0';
  for (std::size_t i = 0; i < preamble - 8; ++i) out += static_cast<char>(header.size() >> (8 * i));
  out += header;
  for (std::int64_t i = 0; i < count * static_cast<std::int64_t>(item_size); ++i) out += static_cast<char>(i * 7);
  return out;
}

std::vector<Bytes> npy_seeds() {
  return {npy_file(1, "<f4", {4, 3}, 4),        npy_file(1, "|u1", {2, 3, 2, 2}, 1), npy_file(2, "<i8", {5}, 8),
          npy_file(3, "<c16", {2, 1}, 16),      npy_file(1, "|b1", {6, 0}, 1),       npy_file(1, "<f2", {0, 3}, 2),
          npy_file(1, "<u2", {3, 2}, 2),        npy_file(1, "<f8", {1}, 8),          npy_file(1, ">f4", {2}, 4),
          npy_file(1, "<f4", {2, 2}, 4, true),  npy_file(1, "<i4", {}, 4)};
}

const std::vector<std::string> kNpyWords = {
    "'descr'", "'shape'", "'fortran_order'", "True", "False", "(", ")", ",", "{", "}", "'", "\"", ":", " ", "\n",
    "<f4", "|b1", "<c8", ">i8", "=u4", "|O", "[('a', '<f4')]", "9223372036854775807", "9223372036854775808",
    "4294967296", "0", "1L", "99999999999999999999", "\x93NUMPY", "PK\x03\x04"};

Bytes npy_input(const std::vector<Bytes>& seeds, Rng& rng) {
  Bytes b = seeds[rng.below(seeds.size())];
  if (rng.one_in(2)) {  // the header's text, its length fixed so that the parser reads it
    const std::size_t preamble = b[6] == 1 ? 10 : 12;
    std::string header = b.substr(preamble, b.find('\n', preamble) + 1 - preamble);
    const Bytes data = b.substr(preamble + header.size());
    for (std::size_t k = 0, count = 1 + rng.below(3); k < count; ++k)
      rng.one_in(2) ? token_mutation(header, rng, kNpyWords) : byte_mutation(header, rng);
    b = b.substr(0, preamble - (b[6] == 1 ? 2 : 4));
    for (std::size_t i = 0; i < preamble - 8; ++i) b += static_cast<char>(header.size() >> (8 * i));
    b += header + data;
    if (rng.one_in(4)) byte_mutation(b, rng);
  } else {
    for (std::size_t k = 0, count = 1 + rng.below(3); k < count; ++k) byte_mutation(b, rng);
  }
  return b;
}

// ---- tokens ---------------------------------------------------------------------------------------

/// A token file: raw (magic 0) or with llm.c's header (magic 20240520 for GPT-2, 20240801 for Llama 3).
Bytes token_file(std::uint32_t magic, int version, std::size_t tokens, int width) {
  Bytes out;
  if (magic != 0) {
    out.assign(1024, '\0');
    put_le(out, 0, 4, magic), put_le(out, 4, 4, static_cast<std::uint64_t>(version)), put_le(out, 8, 4, tokens);
  }
  for (std::size_t i = 0; i < tokens; ++i)
    for (int k = 0; k < width; ++k) out += static_cast<char>((i * 2654435761u) >> (8 * k));
  return out;
}

std::vector<Bytes> token_seeds() {
  // The first byte is the options (token_options below): 0x00 context 1, stride context, uint16.
  return {std::string(1, '\x03') + token_file(0, 0, 40, 2), std::string(1, '\x85') + token_file(0, 0, 33, 4),
          std::string(1, '\x10') + token_file(20240520, 1, 50, 2),
          std::string(1, '\x91') + token_file(20240801, 7, 17, 4), std::string(1, '\x00') + token_file(0, 0, 2, 2)};
}

/// Options from the input's first byte: context 1-16 (or, 1 time in 8, near INT64_MAX), stride 0-3, dtype.
fulgur::data::TokenDatasetOptions token_options(unsigned char b) {
  fulgur::data::TokenDatasetOptions o;
  o.context = (b & 0x0F) == 0x0F ? INT64_MAX - 1 : 1 + (b & 0x0F);
  o.stride = (b >> 4) & 0x3;
  if ((b & 0x70) == 0x70) o.stride = INT64_MAX;
  o.dtype = (b & 0x80) ? fulgur::data::TokenDtype::uint32 : fulgur::data::TokenDtype::uint16;
  return o;
}

Bytes token_input(const std::vector<Bytes>& seeds, Rng& rng) {
  Bytes b = seeds[rng.below(seeds.size())];
  if (rng.one_in(3)) b[0] = static_cast<char>(rng.next());
  if (b.size() > 13 && rng.one_in(3)) {  // llm.c's magic, version or count word
    const std::size_t word = 1 + 4 * rng.below(3);
    std::uint64_t v = 0;
    for (std::size_t i = 4; i-- > 0;) v = v << 8 | static_cast<unsigned char>(b[word + i]);
    put_le(b, word, 4, interesting(rng, v));
  }
  for (std::size_t k = 0, count = rng.below(3); k < count; ++k) byte_mutation(b, rng);
  if (b.empty()) b.push_back('\0');
  return b;
}

// ---- cli ------------------------------------------------------------------------------------------

const fulgur::cli::Schema& cli_schema() {
  static const fulgur::cli::Schema schema =
      fulgur::cli::detail::root_schema<tiny::Tiny, tiny::TinyData>(fulgur::shipped_trainers,
                                                                   fulgur::cli::shipped_classes{});
  return schema;
}

std::vector<Bytes> cli_seeds() {
  return {
      "seed_everything: 3\ntrainer:\n  max_epochs: 7\n  precision: bf16\n  accumulate_grad_batches: 2\n"
      "  gradient_clip_val: 0.5\n  val_check_interval: 0.5\n  limit_train_batches: 10\n  callbacks:\n"
      "  - class_path: lightning.pytorch.callbacks.EarlyStopping\n    init_args:\n      monitor: val_loss\n"
      "      patience: 4\n  - class_path: ModelCheckpoint\n    init_args:\n      monitor: val_loss\n"
      "      save_top_k: 2\n      filename: \"{epoch}-{val_loss:.3f}\"\n  - LearningRateMonitor\n"
      "  logger:\n  - class_path: CSVLogger\n    init_args:\n      name: run\nmodel:\n  hidden: 16\n  lr: 0.1\n"
      "data:\n  samples: 128\n  batch_size: 8\nckpt_path: null\n",
      "trainer: {max_steps: 100, devices: 1, strategy: ddp, max_time: \"00:00:10:00\", logger: false}\n"
      "model: {lr: 1e-3}\n",
      "trainer:\n  strategy:\n    class_path: ddp\n    init_args: {}\n  accelerator: cpu\n  enable_checkpointing: "
      "false\n  callbacks: [Timer, ModelSummary]\nseed_everything: false\n",
      "args\nfit\n--trainer.max_epochs=3\n--model.lr\n0.5\n--trainer.callbacks+=EarlyStopping\n"
      "--trainer.callbacks.monitor=val_loss\n--print_config\n",
      "args\n--help\n",
  };
}

const std::vector<std::string> kYamlWords = {
    "&a ", "*a", "&b [*a, *a, *a, *a]", "<<: *a", "!!str ", "!!int ", "!!map ", "!custom ", "? ", ": ", "- ",
    "[", "]", "{", "}", ",", "'", "\"", "|\n", ">-\n", "\n  ", "\n    - ", "#", "---\n", "...\n", "%YAML 1.2\n",
    "null", "~", "true", "no", ".inf", "-.inf", ".nan", "1e999", "-9223372036854775809", "18446744073709551616",
    "0x1F", "0o17", "1_000", "trainer", "model", "data", "max_epochs", "max_steps", "devices", "precision",
    "strategy", "callbacks", "logger", "class_path", "init_args", "ModelCheckpoint", "EarlyStopping", "ddp",
    "ckpt_path", "seed_everything", "max_time", "monitor", "--trainer.", "--config", "+=", "=", "\\u0000", "\t",
    "\xef\xbb\xbf", "\xff"};

/// YAML that a recursive reader or a naive expansion of aliases mishandles.
std::string hostile_yaml(Rng& rng) {
  static const std::size_t depths[] = {10, 100, 1000, 3000, 20000};
  const std::size_t depth = depths[rng.below(std::size(depths))];
  switch (rng.below(5)) {
    case 0: return "trainer: " + std::string(depth, '[') + std::string(depth, ']') + "\n";
    case 1: return "trainer: " + std::string(depth, '{') + "\n";
    case 2: {  // a billion laughs: 10 levels of 10 aliases
      std::string s = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
      for (int i = 1; i < 10; ++i) {
        s += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
        for (int k = 0; k < 10; ++k) s += (k ? ", *a" : "*a") + std::to_string(i - 1);
        s += "]\n";
      }
      return s + "trainer:\n  callbacks: *a9\n";
    }
    case 3: {
      std::string s = "trainer:\n";
      for (std::size_t i = 0; i < depth % 500; ++i) s += std::string(2 * (i + 1), ' ') + "k:\n";
      return s;
    }
    default: return "trainer: &t\n  max_epochs: 3\n  inner: *t\nmodel: *t\n";
  }
}

Bytes cli_input(const std::vector<Bytes>& seeds, Rng& rng) {
  if (rng.one_in(16)) return hostile_yaml(rng);
  Bytes b = seeds[rng.below(seeds.size())];
  if (rng.one_in(8)) {  // splice: the head of one seed, the tail of another
    const Bytes& other = seeds[rng.below(seeds.size())];
    b = b.substr(0, rng.below(b.size() + 1)) + other.substr(rng.below(other.size() + 1));
  }
  for (std::size_t k = 0, count = 1 + rng.below(4); k < count; ++k)
    rng.below(3) ? token_mutation(b, rng, kYamlWords) : byte_mutation(b, rng);
  return b;
}

// ---- running one input ----------------------------------------------------------------------------

struct Counts {
  std::uint64_t accepted = 0, refused = 0;
  Counts& operator+=(const Counts& batch) {
    accepted += batch.accepted, refused += batch.refused;
    return *this;
  }
};
using Shared = fuzzing::SharedBlock<Counts>;

[[noreturn]] void bug(const std::string& why) { throw std::logic_error(why); }

/// The input as a file the readers can open (an in-memory file: no disk I/O).
std::string as_file(const Bytes& input) {
  static const int fd = ::memfd_create("fulgur-fuzz", MFD_CLOEXEC);
  if (fd < 0 || ::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, input.data(), input.size(), 0) != static_cast<ssize_t>(input.size()))
    bug("cannot write the input to a memfd");
  return "/proc/self/fd/" + std::to_string(fd);
}

void run_npy(const Bytes& input) {
  const fulgur::data::NpyArray array(as_file(input));
  std::int64_t elements = 1;
  for (const std::int64_t d : array.shape()) elements *= d;
  const auto element = static_cast<std::int64_t>(at::elementSize(array.dtype()));
  if (array.data_offset() + elements * element != static_cast<std::int64_t>(input.size()))
    bug("the array's bytes and the file's size disagree");
  if (array.size() > 0) {
    for (const std::int64_t i : {std::int64_t{0}, array.size() - 1}) {
      const at::Tensor sample = array.get(i);
      const char* in_file = input.data() + array.data_offset() + i * (elements / array.size()) * element;
      if (sample.numel() > 0 &&
          std::memcmp(sample.data_ptr(), in_file, static_cast<std::size_t>(sample.numel() * element)) != 0)
        bug("sample " + std::to_string(i) + " is not the file's bytes");
    }
    (void)array.tensor().sum();  // every element, through a kernel
  }
  try {
    (void)array.get(array.size());
    bug("get(size()) did not throw");
  } catch (const fulgur::DataError&) {
  }
}

void run_tokens(const Bytes& input) {
  const fulgur::data::TokenDataset tokens(as_file(input.substr(1)),
                                          token_options(static_cast<unsigned char>(input[0])));
  for (const std::int64_t i : {std::int64_t{0}, tokens.size() - 1}) {
    const fulgur::data::Batch b = tokens.get(i);
    if (b.input.numel() != tokens.context() || !at::equal(b.input.slice(0, 1), b.target.slice(0, 0, -1)))
      bug("window " + std::to_string(i) + "'s target is not its input shifted by one");
  }
  try {
    (void)tokens.get(tokens.size());
    bug("get(size()) did not throw");
  } catch (const fulgur::DataError&) {
  }
}

void run_cli(const Bytes& input) {
  namespace cli = fulgur::cli;
  const cli::Schema& schema = cli_schema();
  cli::Config config(schema);
  if (input.rfind("args\n", 0) == 0) {
    std::vector<std::string> args{"prog"};
    for (std::size_t at = 5; at < input.size();) {
      const std::size_t end = std::min(input.find('\n', at), input.size());
      args.push_back(input.substr(at, end - at));
      at = end + 1;
    }
    const cli::CommandLine command = cli::parse_command_line(args, {"fit", "validate", "test", "predict"});
    for (const cli::Source& source : command.sources)
      if (source.kind != cli::Source::Kind::file) config.apply(source);  // a fuzzed path could name /dev/zero
    if (command.help) (void)cli::help_text(schema, command, {"fit"}, "fuzz", config.tree());
  } else {
    config.apply({cli::Source::Kind::text, "fuzz.yaml", input});
  }
  config.throw_if_problems();
  const std::string text = cli::to_yaml_text(config.tree());
  cli::Config again(schema);
  again.apply({cli::Source::Kind::text, "printed", text});
  if (!again.problems().empty()) bug("the printed config does not resolve: " + again.problems().front() + "\n" + text);
  if (cli::to_yaml_text(again.tree()) != text) bug("the printed config resolves to another config:\n" + text);
  (void)cli::flatten(config.tree());
  (void)cli::read_as<fulgur::TrainerConfig>(config.tree()["trainer"], "trainer");
  (void)cli::read_as<tiny::TinyConfig>(config.tree()["model"], "model");
  std::vector<std::string> problems;  // what the classes' constructors refuse: said, not a bug
  (void)cli::detail::make_classes(config.tree()["trainer"], cli::shipped_classes{}, problems);
  if (!problems.empty()) throw cli::ConfigError(problems);
}

enum class Target { npy, tokens, cli };

/// 0: read or refused as it should be; 1: anything else (message in `shared`).
int run_one(Target target, const Bytes& input, Shared& shared) {
  const auto fail = [&](const std::string& why) { return shared.fail(why); };
  try {
    switch (target) {
      case Target::npy: run_npy(input); break;
      case Target::tokens: run_tokens(input); break;
      case Target::cli: run_cli(input); break;
    }
    ++shared.accepted;
  } catch (const std::logic_error& e) {
    return fail(e.what());
  } catch (const fulgur::DataError& e) {
    if (target == Target::cli) return fail(std::string("a DataError from the config loader: ") + e.what());
    ++shared.refused;
  } catch (const fulgur::MisconfigurationError& e) {
    if (target != Target::cli) return fail(std::string("not a DataError: ") + e.what());
    ++shared.refused;
  } catch (const std::exception& e) {
    return fail(std::string("not fulgur's error: ") + e.what());
  } catch (...) {
    return fail("an exception of unknown type");
  }
  return 0;
}

struct Corpus {
  Target target;
  std::vector<Bytes> seeds;
  std::uint64_t seed = 0;
  Bytes input(std::uint64_t n) const {
    Rng rng{seed * 0x100000001B3ull ^ (n * 0x9E3779B97F4A7C15ull)};
    switch (target) {
      case Target::npy: return npy_input(seeds, rng);
      case Target::tokens: return token_input(seeds, rng);
      case Target::cli: break;
    }
    return cli_input(seeds, rng);
  }
};

[[maybe_unused]] std::vector<Bytes> seeds_of(Target target) {
  switch (target) {
    case Target::npy: return npy_seeds();
    case Target::tokens: return token_seeds();
    case Target::cli: break;
  }
  return cli_seeds();
}

[[maybe_unused]] const char* name_of(Target target) {
  return target == Target::npy ? "npy" : target == Target::tokens ? "tokens" : "cli";
}

}  // namespace

#if FULGUR_LIBFUZZER
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Shared shared{};
  constexpr Target target = FULGUR_LIBFUZZER == 1 ? Target::npy : FULGUR_LIBFUZZER == 2 ? Target::tokens : Target::cli;
  if (target == Target::tokens && size == 0) return 0;
  if (run_one(target, Bytes(reinterpret_cast<const char*>(data), size), shared) != 0) {
    std::fprintf(stderr, "%s\n", shared.message);
    std::abort();
  }
  return 0;
}
#else
int main(int argc, char** argv) {
  const std::string which = argc >= 2 ? argv[1] : "";
  const bool known = which == "npy" || which == "tokens" || which == "cli";
  if (!known || argc < 3) {
    std::fprintf(stderr,
                 "usage: %s <npy|tokens|cli> (<seconds> <seed> | --replay <file>... | --write-seeds <folder>)\n",
                 argv[0]);
    return 2;
  }
  const Target target = which == "npy" ? Target::npy : which == "tokens" ? Target::tokens : Target::cli;
  at::set_num_threads(1);  // no thread pool for the forked children to inherit half of
  if (std::string(argv[2]) == "--replay" || std::string(argv[2]) == "--write-seeds") {
    if (std::string(argv[2]) == "--write-seeds") {
      const std::vector<Bytes> seeds = seeds_of(target);
      for (std::size_t i = 0; argc > 3 && i < seeds.size(); ++i)
        std::ofstream(std::string(argv[3]) + "/seed-" + std::to_string(i), std::ios::binary) << seeds[i];
      return argc > 3 ? 0 : 2;
    }
    Shared shared{};
    int status = 0;
    for (int i = 3; i < argc; ++i) {
      std::ifstream in(argv[i], std::ios::binary);
      const Bytes input(std::istreambuf_iterator<char>(in), {});
      const std::uint64_t accepted = shared.accepted;
      const int result = input.empty() && target == Target::tokens ? 0 : run_one(target, input, shared);
      std::printf("%s: %s\n", argv[i], result ? shared.message : shared.accepted > accepted ? "read" : "refused");
      status |= result;
    }
    return status;
  }
  if (argc < 4) return 2;
  const double seconds = std::atof(argv[2]);
  const std::uint64_t seed = std::strtoull(argv[3], nullptr, 10);
  const Corpus corpus{target, seeds_of(target), seed};
  if (target == Target::cli) (void)cli_schema();  // built once, before the children fork
  Counts totals;
  const fuzzing::Summary summary = fuzzing::run_fork_batches(
      seconds, std::chrono::seconds(20), totals,
      [&](std::uint64_t n, Shared& shared) { return run_one(target, corpus.input(n), shared); },
      [&](std::uint64_t n, const std::string& why) {
        const Bytes input = corpus.input(n);
        std::printf("input %llu (seed %llu): %s\n  input written to %s\n", static_cast<unsigned long long>(n),
                    static_cast<unsigned long long>(seed), why.c_str(),
                    fuzzing::write_artifact(name_of(target), seed, n, input.data(), input.size()).c_str());
      });
  std::printf("fuzz %s: %llu inputs, %llu read, %llu refused, %llu crashes (%.1f s, seed %llu, %zu seeds)\n",
              name_of(target), static_cast<unsigned long long>(summary.inputs),
              static_cast<unsigned long long>(totals.accepted), static_cast<unsigned long long>(totals.refused),
              static_cast<unsigned long long>(summary.failures), summary.seconds,
              static_cast<unsigned long long>(seed), corpus.seeds.size());
  return summary.failures == 0 ? 0 : 1;
}
#endif
