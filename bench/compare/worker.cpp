// One run of the side-by-side comparison (compare.py): the tiny MLP of bench/matrix/mlp.hpp or the GPT of
// bench/matrix/gpt.hpp (the small one, or gpt-large: GPT-2-small-sized by default, its shape set by the options)
// trained for the steps of data.pt from the weights of init.pt (both written by the driver with torch.save),
// either by fulgur's Trainer::fit or by the same loop written by hand against LibTorch.
//   bench_compare_worker fulgur|libtorch PRECISION DIR [mlp|gpt|gpt-large [OPTION...]]
//     --device=cpu|cuda   where it trains (default cpu; cuda: Trainer<CUDAAccelerator, SingleDeviceStrategy, P>,
//                         the hand-written loop on cuda:0)
//     --warmup=N          time steps N.. only, between two device synchronizations (before step N, after the
//                         last step); prints {"step_us", "peak_mib", "losses"} (see below)
//     --layers=N --width=N --heads=N --context=N --vocab=N   gpt-large's shape (default 12, 768, 12, 1024, 50304)
//   bench_compare_worker --probe   (one line naming the program, its modes and models; compare.py checks --worker)
//   bench_compare_worker --cuda    ("bench_compare_worker cuda N" with N >= 1 CUDA devices, exit status 0; else
//                                   "bench_compare_worker: no CUDA device ...", exit status 2)
// Errors (an unknown mode, model, option or precision, a missing DIR/*.pt, a failed run): one line
// "bench_compare_worker: <why>" on stderr, exit status 2.
// Prints one line: {"seconds": <wall time of the training>, "losses": [<loss of each step>]}; with --warmup,
// {"step_us": <µs per step of the timed steps>, "peak_mib": <the CUDA allocator's peak of allocated memory in
// the run, MiB; -1 on the CPU>, "losses": [...]}.
//
// DDP (compare.py --ddp): the MLP on RANKS processes over Gloo, started by fulgur's own launcher (this
// program re-executed once per rank), each rank training on its slice of data.pt's global batches
// (rank r: rows [64 r, 64 r + 64) of each), in float32:
//   bench_compare_worker fulgur-ddp|libtorch-ddp RANKS DIR WARMUP
// fulgur-ddp: Trainer<CPUAccelerator, BasicDDPStrategy<backend::Gloo>, FloatPrecision>::fit;
// libtorch-ddp: the loop by hand, the gradients all-reduced (averaged) as one flat tensor through
// fulgur's ProcessGroup after backward. Rank 0 prints {"step_us": <µs per step of the steps from
// WARMUP on, timed between barriers>, "cpu_us": <the process's CPU time a step over the same steps>,
// "losses": [<its own (local) loss of each step>]}.
#include <fulgur/fulgur.hpp>
#include <torch/torch.h>

// The hand-written DDP loop borrows libfulgur's process group and launcher (internals, not public API).
#include "src/distributed/launcher.hpp"
#include "src/distributed/process_group.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../matrix.hpp"
#include "../matrix/gpt.hpp"
#include "../matrix/mlp.hpp"

namespace {

using clock = std::chrono::steady_clock;

/// {"KEY": VALUE, ..., "losses": [<each step's loss>]} on one line (compare.py reads "peak_mib": -1 as "not
/// measured": the CPU).
void print_result(const std::vector<std::pair<const char*, double>>& fields, const std::vector<at::Tensor>& losses) {
  std::printf("{");
  for (const auto& [key, value] : fields) std::printf("\"%s\": %.9f, ", key, value);
  std::printf("\"losses\": [");
  for (std::size_t i = 0; i < losses.size(); ++i)
    std::printf("%s%.17g", i ? ", " : "", losses[i].to(at::kDouble).template item<double>());
  std::printf("]}\n");
  std::fflush(stdout);
}

/// Times steps first..last: `sync` (a barrier of every rank, or a device synchronization) before step `first`
/// and after step `last`.
struct Window {
  std::function<void()> sync;
  std::int64_t first = 0, last = 0;
  clock::time_point t0{}, t1{};
  double cpu0 = 0, cpu1 = 0;  // the process's CPU time (all threads), µs
  static double process_cpu_us() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) * 1e-3;
  }
  void start(std::int64_t step) {
    if (step != first) return;
    sync();
    t0 = clock::now();
    cpu0 = process_cpu_us();
  }
  void end(std::int64_t step) {
    if (step != last) return;
    sync();
    t1 = clock::now();
    cpu1 = process_cpu_us();
  }
  double steps() const { return static_cast<double>(last - first + 1); }
  double step_us() const { return std::chrono::duration<double, std::micro>(t1 - t0).count() / steps(); }
  double cpu_us() const { return (cpu1 - cpu0) / steps(); }
};

/// A benchmark model with the window in its batch hooks (what Lightning's module does in Python); the
/// hand-written loop calls the window itself (hand_written's hooks).
template <class Impl>
struct TimedImpl : Impl {
  using Impl::Impl;
  std::int64_t on_train_batch_start(const fulgur::data::Batch&, std::int64_t step) {
    window.start(step);
    return 0;
  }
  template <class Output>
  void on_train_batch_end(const Output&, const fulgur::data::Batch&, std::int64_t step) {
    window.end(step);
  }
  void start(std::int64_t step) { window.start(step); }  // hand_written's hooks
  void end(std::int64_t step) { window.end(step); }
  Window window;
};

/// Where and how a single run trains (its OPTIONs).
struct Setting {
  c10::Device device{c10::kCPU};
  std::optional<std::int64_t> warmup;  // set: the timing window (see the top)
};

/// One run: the model of make() (a holder or std::shared_ptr) from DIR/init.pt on DIR/data.pt's batches.
template <class Make>
int run(const std::string& mode, const std::string& precision, const std::string& dir, const Setting& setting,
        Make make) {
  const fulgur::StateDict init = fulgur::checkpoint::load(dir + "/init.pt");
  const fulgur::StateDict data = fulgur::checkpoint::load(dir + "/data.pt");
  const at::Tensor x = data.at("x").toTensor(), y = data.at("y").toTensor();
  std::vector<fulgur::data::Batch> batches;
  for (std::int64_t i = 0; i < x.size(0); ++i) batches.push_back({x[i], y[i]});
  if (setting.warmup && *setting.warmup >= static_cast<std::int64_t>(batches.size()))
    throw std::invalid_argument("--warmup=" + std::to_string(*setting.warmup) + " must be below the number of steps in " +
                                dir + "/data.pt (" + std::to_string(batches.size()) + ")");
  auto model = make();
  model->record_losses = true;
  fulgur::checkpoint::load_module_state_dict(*model, init);
  at::set_num_threads(1);  // the CPU: already; a GPU: LibTorch's threads made and loaded the model (gpt-large: seconds)
  const c10::Device device = setting.device;
  double seconds = 0;
  std::optional<double> peak_mib;
  fulgur::dispatch(device.is_cuda() ? "cuda" : "cpu", "single_device", precision, [&](auto trainer_type) {
    using T = typename decltype(trainer_type)::type;
    using P = typename T::precision_type;
    if constexpr (requires { model->window; }) {  // --warmup: the steps from it on, between synchronizations
      model->window = {[device] { fulgur::bench::detail::synchronize(device); }, *setting.warmup,
                       static_cast<std::int64_t>(batches.size()) - 1};
      fulgur::bench::detail::reset_cuda_peak(device);
      if (mode == "fulgur") {
        T trainer(fulgur::TrainerConfig{.max_epochs = 1, .enable_progress_bar = false});
        trainer.fit(model, batches);
      } else {
        fulgur::GradScaler scaler;
        fulgur::bench::detail::hand_written<P>(model, batches, device, scaler, *model);
      }
      peak_mib = fulgur::bench::detail::cuda_peak_mib(device);
      return;
    } else {
      {  // untimed, for both: two steps of another model pay the process's first-use costs (thread
         // pool, allocator, kernel selection), which the Python runs pay in their warm-up run
        auto warm = make();
        const std::vector<fulgur::data::Batch> two(batches.begin(),
                                                   batches.begin() + std::min<std::size_t>(2, batches.size()));
        fulgur::GradScaler scaler;
        fulgur::bench::detail::hand_written<P>(warm, two, device, scaler);
      }
      if (mode == "fulgur") {
        T trainer(fulgur::TrainerConfig{.max_epochs = 1, .enable_progress_bar = false});
        const auto t0 = clock::now();
        trainer.fit(model, batches);
        seconds = std::chrono::duration<double>(clock::now() - t0).count();
      } else {
        fulgur::GradScaler scaler;  // made before the clock starts, as the Trainer's is
        const auto t0 = clock::now();
        fulgur::bench::detail::hand_written<P>(model, batches, device, scaler);
        seconds = std::chrono::duration<double>(clock::now() - t0).count();
      }
    }
  });
  if constexpr (requires { model->window; })
    print_result({{"step_us", model->window.step_us()}, {"peak_mib", peak_mib.value_or(-1)}}, model->losses);
  else
    print_result({{"seconds", seconds}}, model->losses);
  return 0;
}

/// run() for the model Impl made from `args`: with the timing window when setting.warmup is set, else as a
/// TORCH_MODULE holder of type Holder (the untimed warm-up of two steps, the whole run timed).
template <class Holder, class Impl, class... Args>
int run_model(const std::string& mode, const std::string& precision, const std::string& dir, const Setting& setting,
              const Args&... args) {
  if (setting.warmup)
    return run(mode, precision, dir, setting, [&] { return std::make_shared<TimedImpl<Impl>>(args...); });
  if (setting.device.is_cuda()) throw std::invalid_argument("--device=cuda needs --warmup=N (the timing window)");
  return run(mode, precision, dir, setting, [&] { return Holder(args...); });
}

namespace ddp {

constexpr std::int64_t kBatchPerRank = 64;
using TimedMlp = std::shared_ptr<TimedImpl<fulgur::bench::models::MlpImpl>>;

/// Rank `rank`'s slice of each global batch of dir/data.pt; warmup: the untimed first steps (fewer than all).
std::vector<fulgur::data::Batch> rank_batches(const std::string& dir, int rank, std::int64_t warmup) {
  const fulgur::StateDict data = fulgur::checkpoint::load(dir + "/data.pt");
  const at::Tensor x = data.at("x").toTensor(), y = data.at("y").toTensor();
  if (warmup >= x.size(0))
    throw std::invalid_argument("WARMUP (" + std::to_string(warmup) + ") must be below the number of steps in " + dir +
                                "/data.pt (" + std::to_string(x.size(0)) + ")");
  if ((rank + 1) * kBatchPerRank > x.size(1))
    throw std::invalid_argument(dir + "/data.pt holds " + std::to_string(x.size(1)) + " samples a step, too few for rank " +
                                std::to_string(rank) + " (" + std::to_string(kBatchPerRank) + " a rank)");
  std::vector<fulgur::data::Batch> batches;
  for (std::int64_t i = 0; i < x.size(0); ++i)
    batches.push_back({x[i].narrow(0, rank * kBatchPerRank, kBatchPerRank).contiguous(),
                       y[i].narrow(0, rank * kBatchPerRank, kBatchPerRank).contiguous()});
  return batches;
}

TimedMlp initial_model(const std::string& dir) {
  auto model = std::make_shared<TimedImpl<fulgur::bench::models::MlpImpl>>();
  model->record_losses = true;
  fulgur::checkpoint::load_module_state_dict(*model, fulgur::checkpoint::load(dir + "/init.pt"));
  return model;
}

int run_fulgur(int ranks, const std::string& dir, std::int64_t warmup) {
  fulgur::TrainerConfig config{.max_epochs = 1, .enable_progress_bar = false};
  config.devices = ranks;  // more than 1: the launcher re-executes this program once per rank, here
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::BasicDDPStrategy<fulgur::backend::Gloo>, fulgur::FloatPrecision>
      trainer(config);
  TimedMlp model = initial_model(dir);
  const auto batches = rank_batches(dir, trainer.global_rank(), warmup);
  model->window = {[&] { trainer.barrier(); }, warmup, static_cast<std::int64_t>(batches.size()) - 1};
  trainer.fit(model, batches);
  if (trainer.is_global_zero())
    print_result({{"step_us", model->window.step_us()}, {"cpu_us", model->window.cpu_us()}}, model->losses);
  return 0;
}

int run_libtorch(int ranks, const std::string& dir, std::int64_t warmup) {
  namespace dist = fulgur::distributed;
  const dist::ClusterEnvironment env = dist::detect_environment();
  if (env.source == dist::ClusterEnvironment::Source::none && ranks > 1) dist::launch_local_workers({ranks, 1});
  dist::ProcessGroup group(dist::BackendKind::gloo, env, std::chrono::minutes(5));
  TimedMlp model = initial_model(dir);
  const auto batches = rank_batches(dir, env.rank, warmup);
  const std::vector<at::Tensor> parameters = model->parameters();
  auto optimizer = model->configure_optimizers();
  Window window{[&] { group.barrier(); }, warmup, static_cast<std::int64_t>(batches.size()) - 1};
  std::vector<at::Tensor> grads(parameters.size());
  for (std::int64_t step = 0; step < static_cast<std::int64_t>(batches.size()); ++step) {
    window.start(step);
    model->training_step(batches[static_cast<std::size_t>(step)], step).backward();
    for (std::size_t i = 0; i < parameters.size(); ++i) grads[i] = parameters[i].grad().view(-1);
    const at::Tensor flat = torch::cat(grads);
    group.all_reduce(flat, fulgur::ReduceOp::mean);
    std::int64_t offset = 0;
    for (const at::Tensor& grad : grads) {
      grad.copy_(flat.narrow(0, offset, grad.numel()));
      offset += grad.numel();
    }
    optimizer->step();
    optimizer->zero_grad();
    window.end(step);
  }
  if (env.rank == 0) print_result({{"step_us", window.step_us()}, {"cpu_us", window.cpu_us()}}, model->losses);
  return 0;
}

}  // namespace ddp
}  // namespace

namespace {

constexpr const char* kUsage =
    "usage: bench_compare_worker fulgur|libtorch PRECISION DIR [mlp|gpt|gpt-large [OPTION...]]\n"
    "         OPTION: --device=cpu|cuda --warmup=N --layers=N --width=N --heads=N --context=N --vocab=N\n"
    "       bench_compare_worker fulgur-ddp|libtorch-ddp RANKS DIR WARMUP\n"
    "       bench_compare_worker --probe   (prints \"bench_compare_worker\" and the modes: compare.py's check)\n"
    "       bench_compare_worker --cuda    (\"bench_compare_worker cuda N\" when LibTorch sees N >= 1 CUDA devices)\n";

int usage(const std::string& why) {
  std::cerr << "bench_compare_worker: " << why << "\n" << kUsage;
  return 2;
}

/// A whole decimal number in [low, high], or nullopt.
std::optional<std::int64_t> integer(const std::string& text, std::int64_t low, std::int64_t high) {
  try {
    std::size_t used = 0;
    const long long value = std::stoll(text, &used);
    if (used != text.size() || value < low || value > high) return std::nullopt;
    return value;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

/// An exception's message on one line (a c10::Error without its C++ backtrace): compare.py shows the
/// last line of stderr in the failed row.
std::string one_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  for (char& c : text)
    if (c == '\n') c = ' ';
  return text;
}

/// The single run's OPTIONs (argv[first..]): where it trains, its timing window and gpt-large's shape.
int single(const std::string& mode, const std::string& precision, const std::string& dir, const std::string& model,
           const std::vector<std::string>& options) {
  Setting setting;
  fulgur::bench::models::GptOptions large{.vocab = 50304, .width = 768, .heads = 12, .context = 1024, .layers = 12};
  for (const std::string& option : options) {
    const auto equals = option.find('=');
    const std::string name = option.substr(0, equals), value = equals == std::string::npos ? "" : option.substr(equals + 1);
    const auto number = integer(value, 0, std::numeric_limits<std::int32_t>::max());
    std::int64_t* shape = name == "--layers"    ? &large.layers
                          : name == "--width"   ? &large.width
                          : name == "--heads"   ? &large.heads
                          : name == "--context" ? &large.context
                          : name == "--vocab"   ? &large.vocab
                                                : nullptr;
    if (option == "--device=cpu" || option == "--device=cuda") {
      // cuda:0, an index (not the current device): the allocator's statistics are read by index
      setting.device = option == "--device=cuda" ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
    } else if (name == "--device") {
      return usage("unknown device '" + value + "' (--device=cpu or --device=cuda)");
    } else if (name == "--warmup" && number) {
      setting.warmup = *number;
    } else if (shape != nullptr && model == "gpt-large" && number && *number >= 1) {
      *shape = *number;
    } else if (shape != nullptr && model != "gpt-large") {
      return usage(name + " sets gpt-large's shape, not " + model + "'s");
    } else if (shape != nullptr || name == "--warmup") {
      return usage(name + " takes a whole number" + (shape ? " >= 1" : " >= 0") + ", not '" + value + "'");
    } else {
      return usage("unknown option '" + option + "'");
    }
  }
  if (large.width % large.heads != 0)
    return usage("--width=" + std::to_string(large.width) + " is not a multiple of --heads=" + std::to_string(large.heads));
  if (setting.device.is_cuda() && !torch::cuda::is_available())
    return usage("--device=cuda: no CUDA device (torch::cuda::is_available() is false here)");
  if (!setting.device.is_cuda()) at::set_num_threads(1);  // on a GPU: after the model is made (run)
  namespace models = fulgur::bench::models;
  if (model == "gpt-large") return run_model<models::Gpt, models::GptImpl>(mode, precision, dir, setting, large);
  if (model == "gpt") return run_model<models::Gpt, models::GptImpl>(mode, precision, dir, setting);
  return run_model<models::Mlp, models::MlpImpl>(mode, precision, dir, setting);
}

int dispatch_mode(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "--probe" && argc == 2) {
    std::printf("bench_compare_worker fulgur libtorch fulgur-ddp libtorch-ddp mlp gpt gpt-large\n");
    return 0;
  }
  if (mode == "--cuda" && argc == 2) {
    if (!torch::cuda::is_available()) {  // one line: compare.py shows it
      std::cerr << "bench_compare_worker: no CUDA device: torch::cuda::is_available() is false (LibTorch sees "
                << static_cast<int>(torch::cuda::device_count()) << " CUDA devices)" << std::endl;
      return 2;
    }
    std::printf("bench_compare_worker cuda %d\n", static_cast<int>(torch::cuda::device_count()));
    return 0;
  }
  if (mode == "fulgur-ddp" || mode == "libtorch-ddp") {
    if (argc != 5) return usage(mode + " takes RANKS DIR WARMUP");
    const auto ranks = integer(argv[2], 1, 1024);
    const auto warmup = integer(argv[4], 0, std::numeric_limits<std::int64_t>::max());
    if (!ranks) return usage(std::string("RANKS must be a whole number from 1 to 1024, not '") + argv[2] + "'");
    if (!warmup) return usage(std::string("WARMUP must be a whole number >= 0, not '") + argv[4] + "'");
    at::set_num_threads(1);
    if (mode == "fulgur-ddp") return ddp::run_fulgur(static_cast<int>(*ranks), argv[3], *warmup);
    return ddp::run_libtorch(static_cast<int>(*ranks), argv[3], *warmup);
  }
  if (mode == "fulgur" || mode == "libtorch") {
    if (argc < 4) return usage(mode + " takes PRECISION DIR [mlp|gpt|gpt-large [OPTION...]]");
    const std::string model = argc >= 5 ? argv[4] : "mlp";
    if (model != "mlp" && model != "gpt" && model != "gpt-large")
      return usage("unknown model '" + model + "' (mlp, gpt or gpt-large)");
    return single(mode, argv[2], argv[3], model, std::vector<std::string>(argv + std::min(argc, 5), argv + argc));
  }
  return usage(mode.empty() ? "no mode given" : "unknown mode '" + mode + "'");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return dispatch_mode(argc, argv);
  } catch (const std::exception& e) {  // a bad precision, a missing or unreadable DIR/*.pt, a failed run
    std::fflush(stdout);
    std::cerr << "bench_compare_worker: " << one_line(e) << std::endl;
    return 2;
  }
}
