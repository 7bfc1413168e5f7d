// A seeded mutation fuzzer for fulgur::checkpoint::from_bytes: every input must either load or throw
// fulgur::CheckpointError — no crash, no abort, no other exception, no allocation failure inside
// LibTorch (fulgur's checks must refuse a forged size before LibTorch allocates it).
//
//   fulgur_checkpoint_fuzz <seconds> <seed> [extra seed files...]
//   fulgur_checkpoint_fuzz --replay <file>...
//   fulgur_checkpoint_fuzz --write-seeds <folder>   (the seed checkpoints and their pickles: a corpus for
//                                                    the libFuzzer target, which zips an input that is a pickle)
//
// Inputs are valid checkpoints mutated at random (bit flips, byte and integer overwrites, truncation,
// chunks duplicated, removed or inserted), mutated where it matters (zip local headers, central
// directory and end records; the pickle's opcodes and their integer arguments, re-zipped so that the
// unpickler sees them), and hostile pickles (deep nesting, containers that hold themselves, forged
// memo indices and string lengths). Input n of seed s is the same on every run. Batches run in a
// forked child (tests/fuzz/fork_batch_driver.hpp): a crash is counted, its input written to
// checkpoint-fuzz-<seed>-<n>.bin (in $FULGUR_FUZZ_ARTIFACTS or the current folder), and the run goes
// on; the exit code is 1 if any input crashed, hung or threw anything but CheckpointError. An input
// refused only for its Python objects must load with PythonObjects::as_dicts; whatever loads must
// save and load again.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/jit/serialization/pickle.h>
#include <caffe2/serialize/inline_container.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fulgur/checkpoint/io.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/state_dict.hpp"
#include "tests/checkpoint/fuzz_inputs.hpp"
#include "tests/fuzz/fork_batch_driver.hpp"

namespace {

using namespace checkpoint_fuzz;

// ---- running -------------------------------------------------------------------------------------

// What refused an input: fulgur's zip, pickle or tensor checks, or LibTorch (a tensor it cannot make).
const char* const kRefusedBy[] = {"not a checkpoint", "truncated", "zip check", "pickle check", "tensor check", "LibTorch",
                                  "unreadable content"};
const fulgur::checkpoint::LoadOptions as_dicts{.python_objects = fulgur::checkpoint::PythonObjects::as_dicts};

/// By the message's start, which is fulgur's (what follows may quote the file).
std::size_t refused_by(const std::string& what) {
  const auto starts = [&](const char* text) { return what.rfind(std::string("fulgur: fuzz input is ") + text, 0) == 0; };
  if (starts("corrupt: LibTorch cannot read it (")) return 5;
  if (starts("not a checkpoint") || starts("empty")) return 0;
  if (starts("truncated")) return 1;
  if (starts("corrupt: its data.pkl")) return 3;
  if (starts("corrupt: tensor") || starts("corrupt: the storage of tensor")) return 4;
  if (what.rfind("fulgur: fuzz input holds ", 0) == 0) return 6;
  return 2;
}

struct Counts {
  std::uint64_t loaded = 0, rejected = 0, resaved = 0, python_objects = 0;
  std::uint64_t refused[std::size(kRefusedBy)] = {};
  Counts& operator+=(const Counts& batch) {
    loaded += batch.loaded, rejected += batch.rejected, resaved += batch.resaved;
    python_objects += batch.python_objects;
    for (std::size_t i = 0; i < std::size(kRefusedBy); ++i) refused[i] += batch.refused[i];
    return *this;
  }
};
// Failed: an exception other than CheckpointError, or an allocation failure reaching LibTorch.
using Shared = fuzzing::SharedBlock<Counts>;

void touch(const c10::IValue& v, int depth = 0) {
  if (depth > 2000) throw std::runtime_error("fuzz: a loaded value nests deeper than fulgur allows");
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    if (!t.defined() || t.is_meta()) return;
    // Every byte of the storage, then every element of the view (kernels exist for most dtypes).
    const auto* bytes = static_cast<const volatile unsigned char*>(t.storage().data());
    unsigned sum = 0;
    for (std::size_t i = 0; i < t.storage().nbytes(); ++i) sum += bytes[i];
    (void)sum;
    try {
      (void)t.clone();
    } catch (const c10::Error& e) {
      if (std::string(e.what()).find("not implemented for") == std::string::npos) throw;  // e.g. 'UInt5'
    }
  } else if (v.isGenericDict()) {
    for (const auto& item : v.toGenericDict()) touch(item.key(), depth + 1), touch(item.value(), depth + 1);
  } else if (v.isList()) {
    for (const c10::IValue& item : v.toListRef()) touch(item, depth + 1);
  } else if (v.isTuple()) {
    for (const c10::IValue& item : v.toTupleRef().elements()) touch(item, depth + 1);
  }
}

/// 0: loaded or refused as it should be; 1: anything else (message in `shared`).
int run_one(const Bytes& input, Shared& shared) {
  const auto fail = [&](const std::string& why) { return shared.fail(why); };
  try {
    fulgur::StateDict state;
    try {
      state = fulgur::checkpoint::from_bytes(input, "fuzz input");
    } catch (const fulgur::CheckpointError& e) {
      if (std::string(e.what()).rfind("fulgur: fuzz input holds pickled Python objects", 0) != 0) throw;
      // Refused for its Python objects alone: it loads when they are asked for.
      ++shared.python_objects;
      try {
        state = fulgur::checkpoint::from_bytes(input, "fuzz input", as_dicts);
      } catch (const std::exception& again) {
        return fail(std::string("refused for its Python objects, but does not load with them as dictionaries: ") +
                    again.what());
      }
    }
    touch(state.to_ivalue());
    ++shared.loaded;
    // What fulgur loads, it can write and read again.
    Bytes again;
    try {
      again = fulgur::checkpoint::to_bytes(state);
    } catch (const std::exception&) {
      return 0;  // e.g. a complex tensor the pickler does not write: not the reader's business
    }
    try {
      touch(fulgur::checkpoint::from_bytes(again, "re-saved fuzz input").to_ivalue());
      ++shared.resaved;
    } catch (const std::exception& e) {
      return fail(std::string("a loaded input, saved again, does not load: ") + e.what());
    }
  } catch (const fulgur::CheckpointError& e) {
    const std::string what = e.what();
    const std::string inner = what.substr(std::min(what.size(), what.find(" (") + 2));  // LibTorch's message
    if (refused_by(what) == 5 && (inner.rfind("std::bad_alloc", 0) == 0 || inner.rfind("DefaultCPUAllocator", 0) == 0 ||
                                  inner.rfind("vector::", 0) == 0 || inner.rfind("basic_string::", 0) == 0))
      return fail("an allocation failure reached LibTorch: " + what);
    ++shared.rejected;
    ++shared.refused[refused_by(what)];
  } catch (const std::exception& e) {
    return fail(std::string("not a CheckpointError: ") + e.what());
  } catch (...) {
    return fail("not a CheckpointError: an exception of unknown type");
  }
  return 0;
}

struct Corpus {
  std::vector<Seed> seeds;
  std::uint64_t seed = 0;
  Bytes input(std::uint64_t n) const {
    Rng rng{seed * 0x100000001B3ull ^ (n * 0x9E3779B97F4A7C15ull)};
    return mutate(seeds[n % seeds.size()], rng);
  }
};

[[maybe_unused]] Corpus make_corpus(std::uint64_t seed, const std::vector<std::string>& extra) {
  Corpus c;
  c.seed = seed;
  fulgur::StateDict small;
  small.insert("a", int64_t{1});
  c.seeds.push_back(make_seed(fulgur::checkpoint::to_bytes(rich_state())));
  c.seeds.push_back(make_seed(fulgur::checkpoint::to_bytes(small)));
  c.seeds.push_back(make_seed(torch::jit::pickle_save(rich_state().to_ivalue())));  // type-tagged, as LibTorch writes
  c.seeds.push_back(make_seed(python_seed()));
  for (const std::string& path : extra) {
    std::ifstream in(path, std::ios::binary);
    c.seeds.push_back(make_seed(Bytes(std::istreambuf_iterator<char>(in), {})));
  }
  for (const Seed& s : c.seeds) {  // a seed that does not load would fuzz only the refusals
    try {
      (void)fulgur::checkpoint::from_bytes(s.bytes, "seed", as_dicts);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fuzz: seed %zu does not load: %s\n", static_cast<std::size_t>(&s - c.seeds.data()), e.what());
      std::exit(2);
    }
  }
  return c;
}

/// LibTorch warns on some inputs ("Trying to load a Subclassed Tensor"): thousands of lines.
struct QuietWarnings final : c10::WarningHandler {
  void process(const c10::Warning&) override {}
} quiet;

[[maybe_unused]] int replay(int argc, char** argv) {
  auto* shared = new Shared{};
  int status = 0;
  for (int i = 2; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    const Bytes input(std::istreambuf_iterator<char>(in), {});
    const std::uint64_t loaded = shared->loaded;
    const int result = run_one(input, *shared);
    std::printf("%s: %s\n", argv[i], result ? shared->message : shared->loaded > loaded ? "loaded" : "rejected");
    status |= result;
  }
  return status;
}

}  // namespace

#if FULGUR_LIBFUZZER
// An input that starts as a pickle does (PROTO, 0x80) is a data.pkl: it is zipped with the rich seed's
// tensor records, so that libFuzzer's mutations inside it reach the unpickler rather than fail the zip's
// CRC-32. Any other input is the file itself (one starting with 0x80 is no zip: refused at once anyway).
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Shared shared{};
  static const Seed records = make_seed(fulgur::checkpoint::to_bytes(rich_state()));
  c10::WarningUtils::set_warning_handler(&quiet);
  Bytes input(data, data + size);
  if (size > 0 && data[0] == 0x80) input = rezip(records, std::string(input.begin(), input.end()));
  if (run_one(input, shared) != 0) {
    std::fprintf(stderr, "%s\n", shared.message);
    std::abort();
  }
  return 0;
}
#else
int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--replay") return replay(argc, argv);
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: %s <seconds> <seed> [extra seed files...] | --replay <file>... | --write-seeds <folder>\n",
                 argv[0]);
    return 2;
  }
  at::set_num_threads(1);  // no thread pool for the forked children to inherit half of
  c10::WarningUtils::set_warning_handler(&quiet);
  if (std::string(argv[1]) == "--write-seeds") {
    const Corpus corpus = make_corpus(0, {});
    for (std::size_t i = 0; i < corpus.seeds.size(); ++i) {  // the files, and their pickles alone
      const Seed& s = corpus.seeds[i];
      std::ofstream(std::string(argv[2]) + "/seed-" + std::to_string(i), std::ios::binary)
          .write(s.bytes.data(), static_cast<std::streamsize>(s.bytes.size()));
      std::ofstream(std::string(argv[2]) + "/pickle-" + std::to_string(i), std::ios::binary) << s.pickle;
    }
    return 0;
  }
  const double seconds = std::atof(argv[1]);
  const std::uint64_t seed = std::strtoull(argv[2], nullptr, 10);
  const Corpus corpus = make_corpus(seed, std::vector<std::string>(argv + 3, argv + argc));
  Counts totals;
  const fuzzing::Summary summary = fuzzing::run_fork_batches(
      seconds, std::chrono::seconds(60), totals,
      [&](std::uint64_t n, Shared& shared) { return run_one(corpus.input(n), shared); },
      [&](std::uint64_t n, const std::string& why) {
        const Bytes input = corpus.input(n);
        std::printf("input %llu (seed %llu): %s\n  input written to %s\n", static_cast<unsigned long long>(n),
                    static_cast<unsigned long long>(seed), why.c_str(),
                    fuzzing::write_artifact("checkpoint", seed, n, input.data(), input.size()).c_str());
      });
  std::printf("fuzz: %llu inputs, %llu loaded, %llu rejected, %llu crashes\n",
              static_cast<unsigned long long>(summary.inputs), static_cast<unsigned long long>(totals.loaded),
              static_cast<unsigned long long>(totals.rejected), static_cast<unsigned long long>(summary.failures));
  std::printf("(%.1f s, seed %llu, %zu seed checkpoints; %llu loaded inputs saved and loaded again; %llu loaded "
              "only with Python objects as dictionaries)\n", summary.seconds, static_cast<unsigned long long>(seed),
              corpus.seeds.size(), static_cast<unsigned long long>(totals.resaved),
              static_cast<unsigned long long>(totals.python_objects));
  std::printf("(refused by:");
  for (std::size_t i = 0; i < std::size(kRefusedBy); ++i)
    std::printf(" %s %llu%s", kRefusedBy[i], static_cast<unsigned long long>(totals.refused[i]),
                i + 1 < std::size(kRefusedBy) ? "," : ")\n");
  return summary.failures == 0 ? 0 : 1;
}
#endif
