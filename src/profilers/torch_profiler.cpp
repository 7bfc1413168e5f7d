// TorchProfiler (fulgur/profilers/torch_profiler.hpp): LibTorch's Kineto profiler from C++ under
// torch.profiler.schedule's state machine, fulgur's actions as record_function ranges.
#include "fulgur/profilers/torch_profiler.hpp"

#include <ATen/record_function.h>
#include <c10/core/DeviceType.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#if FULGUR_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "fulgur/errors.hpp"
#include "fulgur/profilers/report_file.hpp"

namespace fulgur {
namespace detail {
/// torch.profiler.ProfilerAction. Outside the anonymous namespace: TorchProfiler::State holds one (GCC's
/// -Wsubobject-linkage where this file is compiled in a unity batch).
enum class ProfilerPhase { none, warmup, record, record_and_save };
}  // namespace detail

namespace {

namespace kineto = torch::autograd::profiler;
namespace impl = torch::profiler::impl;
using Phase = detail::ProfilerPhase;

/// torch.profiler.schedule's function.
Phase phase_at(const ProfilerSchedule& s, std::int64_t step) {
  if (step < s.skip_first) return Phase::none;
  step -= s.skip_first;
  const std::int64_t cycle = s.wait + s.warmup + s.active;
  if (s.repeat > 0 && step / cycle >= s.repeat) return Phase::none;
  const std::int64_t in_cycle = step % cycle;
  if (in_cycle < s.wait) return Phase::none;
  if (in_cycle < s.wait + s.warmup) return Phase::warmup;
  return in_cycle < cycle - 1 ? Phase::record : Phase::record_and_save;
}

bool recording(Phase p) { return p == Phase::record || p == Phase::record_and_save; }

std::string time_text(std::int64_t ns) {  // torch's _format_time
  const double us = static_cast<double>(ns) / 1e3;
  char text[32];
  if (us >= 1e6) std::snprintf(text, sizeof text, "%.3fs", us / 1e6);
  else if (us >= 1e3) std::snprintf(text, sizeof text, "%.3fms", us / 1e3);
  else std::snprintf(text, sizeof text, "%.3fus", us);
  return text;
}

std::string percent_text(std::int64_t part, std::int64_t whole) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f%%", whole > 0 ? 100.0 * static_cast<double>(part) / static_cast<double>(whole) : 0.0);
  return text;
}

constexpr const char* kSortKeys[] = {"self_cpu_time_total", "self_cuda_time_total", "cpu_time_total",
                                     "cuda_time_total", "count"};

void check(const TorchProfilerOptions& o) {
  const ProfilerSchedule& s = o.schedule;
  if (s.skip_first < 0 || s.wait < 0 || s.warmup < 0 || s.active < 0 || s.repeat < 0)
    throw MisconfigurationError("fulgur: TorchProfiler's schedule has a negative count (skip_first " +
                                std::to_string(s.skip_first) + ", wait " + std::to_string(s.wait) + ", warmup " +
                                std::to_string(s.warmup) + ", active " + std::to_string(s.active) + ", repeat " +
                                std::to_string(s.repeat) + "); each is a number of steps, >= 0.");
  if (s.active == 0)
    throw MisconfigurationError("fulgur: TorchProfiler's schedule records no step (active = 0): give it active >= 1, "
                                "the number of steps each trace holds (torch.profiler.schedule refuses it too).");
  if (!o.sort_by_key.empty() && std::find_if(std::begin(kSortKeys), std::end(kSortKeys), [&](const char* k) {
                                  return o.sort_by_key == k;
                                }) == std::end(kSortKeys))
    throw MisconfigurationError("fulgur: TorchProfiler's sort_by_key '" + o.sort_by_key +
                                "' is none of self_cpu_time_total, self_cuda_time_total, cpu_time_total, "
                                "cuda_time_total, count.");
#if !FULGUR_WITH_CUDA
  if (o.emit_nvtx)
    throw MisconfigurationError("fulgur: TorchProfiler's emit_nvtx needs fulgur built with CUDA (FULGUR_WITH_CUDA).");
#endif
}

}  // namespace

struct TorchProfiler::State {
  TorchProfilerOptions options;
  ProfilerSetup setup{};
  std::string dir, table_path;
  std::int64_t step = 0;
  std::int64_t steps_in_trace = 0;  // steps begun while this recording is on: none, and its trace is not a step's
  Phase phase = Phase::none;
  bool prepared = false, enabled = false;
  bool ready = false;  // set up for a stage that has not reported yet
  int cycle = 0;        // never reset: a later fit's traces do not overwrite an earlier one's
  /// Per action id: 0 not looked at, 1 a step of this stage (the schedule steps after it), 2 not.
  std::vector<std::int8_t> kinds;
  std::vector<std::string> names;  // per action id, filled on first use
  struct Open {
    std::uint32_t id;
    std::unique_ptr<at::RecordFunction> range;  // null: not recording when the action started
    bool nvtx;
  };
  std::vector<Open> open;
  std::map<std::string, OperatorRow> rows;  // this stage's operators
  std::vector<std::string> traces;

  const std::string& name_of(std::uint32_t id) {
    if (id >= names.size()) names.resize(id + 1);
    if (names[id].empty()) names[id] = std::string(profiling::action_name(id));
    return names[id];
  }
  bool is_step(std::uint32_t id) {
    if (id >= kinds.size()) kinds.resize(std::max<std::size_t>(id + 1, profiling::action_count()), 0);
    if (kinds[id] == 0) {
      const std::string& name = name_of(id);
      const std::string step_name = setup.stage == Stage::fit ? "run_training_batch" : std::string(to_string(setup.stage)) + "_step";
      const bool step = setup.stage == Stage::fit ? name == step_name
                                                  : name.starts_with("[Strategy]") && name.ends_with("." + std::string(
                                                        setup.stage == Stage::validate ? "validation_step" : step_name));
      kinds[id] = step ? 1 : 2;
    }
    return kinds[id] == 1;
  }

  impl::ProfilerConfig config() const {
    return impl::ProfilerConfig(impl::ProfilerState::KINETO, options.record_shapes, options.profile_memory,
                                options.with_stack, options.with_flops);
  }
  static std::set<impl::ActivityType> activities() {
    std::set<impl::ActivityType> kinds{impl::ActivityType::CPU};
    if (torch::cuda::is_available()) kinds.insert(impl::ActivityType::CUDA);
    return kinds;
  }
  void prepare() {
    if (prepared || enabled) return;
    kineto::prepareProfiler(config(), activities());
    prepared = true;
  }
  void enable() {
    if (enabled) return;
    prepare();
    kineto::enableProfiler(config(), activities());
    enabled = true;
    steps_in_trace = 0;
  }
  /// Stops recording; the trace is written (save) or dropped.
  void finish(bool save) {
    if (!enabled && prepared) enable();  // a prepared profiler is ended by starting it (torch does the same)
    if (!enabled) return;
    for (Open& o : open)  // ranges still open end here: the trace must not outlive them
      if (o.range) std::exchange(o.range, nullptr)->end();
    std::unique_ptr<kineto::ProfilerResult> result = kineto::disableProfiler();
    enabled = prepared = false;
    if (!save || !result) return;
    add(*result);
    const std::string path =
        dir + "/" + profiling::report_file_name(setup, options.filename, "." + std::to_string(cycle++) + ".pt.trace.json");
    result->save(path);
    traces.push_back(path);
  }
  void move_to(Phase next) {
    const Phase from = phase;
    phase = next;
    if (from == Phase::record_and_save) finish(true);
    if (next == Phase::warmup) prepare();
    if (recording(next)) enable();
  }

  /// Kineto's events into per-name rows: self time from the nesting of each thread's CPU events.
  void add(const kineto::ProfilerResult& result) {
    struct Span {
      const kineto::KinetoEvent* event;
      std::int64_t start, end;
    };
    std::map<std::uint64_t, std::vector<Span>> by_thread;
    for (const kineto::KinetoEvent& e : result.events()) {
      OperatorRow& row = rows[e.name()];
      row.name = e.name();
      const auto duration = static_cast<std::int64_t>(e.durationNs());
      if (e.deviceType() == c10::DeviceType::CPU) {
        ++row.calls;
        row.cpu_total_ns += duration;
        row.flops += static_cast<std::int64_t>(e.flops());
        by_thread[e.startThreadId()].push_back(
            {&e, static_cast<std::int64_t>(e.startNs()), static_cast<std::int64_t>(e.endNs())});
      } else {
        if (row.calls == 0 && row.cpu_total_ns == 0) ++row.calls;  // a kernel: its launches count it
        row.self_device_ns += duration;
        row.device_total_ns += duration;
      }
    }
    for (auto& [thread, spans] : by_thread) {
      std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
        return a.start != b.start ? a.start < b.start : a.end > b.end;
      });
      std::vector<std::pair<const Span*, std::int64_t>> stack;  // an enclosing span and its children's time
      auto close = [&] {
        const auto [span, children] = stack.back();
        stack.pop_back();
        rows[span->event->name()].self_cpu_ns += (span->end - span->start) - children;
      };
      for (const Span& span : spans) {
        while (!stack.empty() && stack.back().first->end <= span.start) close();
        if (!stack.empty()) stack.back().second += span.end - span.start;
        stack.emplace_back(&span, 0);
      }
      while (!stack.empty()) close();
    }
  }
};

TorchProfiler::TorchProfiler(TorchProfilerOptions options) : state_(std::make_unique<State>()) {
  check(options);
  state_->options = std::move(options);
}
TorchProfiler::~TorchProfiler() {
  if (state_ && (state_->enabled || state_->prepared)) {
    try {
      state_->finish(false);
    } catch (...) {  // a destructor does not throw; the profiler is off either way
    }
  }
}
TorchProfiler::TorchProfiler(TorchProfiler&&) noexcept = default;
TorchProfiler& TorchProfiler::operator=(TorchProfiler&&) noexcept = default;

const TorchProfilerOptions& TorchProfiler::options() const { return state_->options; }
const std::vector<std::string>& TorchProfiler::trace_files() const { return state_->traces; }

void TorchProfiler::set_up(const ProfilerSetup& setup) {
  State& s = *state_;
  // Kineto, built with CUPTI, logs "gpuGetDeviceCount failed" as an error on a machine without a GPU:
  // noise there (a user's own KINETO_LOG_LEVEL is kept; with a GPU, Kineto's errors are worth seeing).
  if (!torch::cuda::is_available()) ::setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
  if (s.enabled || s.prepared) s.finish(false);
  s.setup = setup;
  s.kinds.assign(profiling::action_count(), 0);
  s.rows.clear();
  s.open.clear();
  s.step = 0;
  s.phase = Phase::none;
  s.ready = false;
  s.dir = s.options.dirpath.empty() ? setup.log_dir : s.options.dirpath;
  if (s.dir.empty()) s.dir = ".";
  // The folder is made and checked now, before any training (the table file with a filename; a probe
  // otherwise, since every trace goes there).
  const std::string probe = s.options.filename.empty() ? profiling::report_file_name(setup, "", ".probe")
                                                      : profiling::report_file_name(setup, s.options.filename, ".txt");
  const std::string path = profiling::open_report_file(
      s.dir, probe, profiling::folder_origin(!s.options.dirpath.empty(), "TorchProfilerOptions::dirpath"));
  if (s.options.filename.empty()) std::remove(path.c_str());
  else s.table_path = path;
  s.move_to(phase_at(s.options.schedule, 0));
  s.ready = true;
}

void TorchProfiler::start(Action action) {
  State& s = *state_;
  State::Open open{action.id(), nullptr, false};
  if (s.enabled) {
    if (s.is_step(action.id())) ++s.steps_in_trace;
    open.range = std::make_unique<at::RecordFunction>(at::RecordScope::USER_SCOPE);
    if (open.range->isActive()) open.range->before(std::string_view(s.name_of(action.id())));
  }
#if FULGUR_WITH_CUDA
  if (s.options.emit_nvtx) {
    nvtxRangePushA(s.name_of(action.id()).c_str());
    open.nvtx = true;
  }
#endif
  s.open.push_back(std::move(open));
}

void TorchProfiler::stop(Action action) noexcept {
  State& s = *state_;
  auto it = std::find_if(s.open.rbegin(), s.open.rend(), [&](const State::Open& o) { return o.id == action.id(); });
  if (it == s.open.rend()) return;  // started before this stage
  try {
    if (it->range) it->range->end();
#if FULGUR_WITH_CUDA
    if (it->nvtx) nvtxRangePop();
#endif
    s.open.erase(std::next(it).base());
    if (s.is_step(action.id())) {
      ++s.step;
      s.move_to(phase_at(s.options.schedule, s.step));
    }
  } catch (const std::exception& e) {  // stop runs in destructors: say it, never throw
    std::cerr << "fulgur: TorchProfiler: " << e.what() << std::endl;
  }
}

void TorchProfiler::describe() {
  State& s = *state_;
  if (!std::exchange(s.ready, false)) return;  // its set-up failed: the stage's error says why
  // A stage that ends as the recording opens recorded only its own ending (on_train_end, teardown):
  // not a trace of any step, so not written (a stage cut inside a recorded step keeps that part).
  if (recording(s.phase)) s.finish(s.steps_in_trace > 0);
  else if (s.enabled || s.prepared) s.finish(false);
  s.phase = Phase::none;
  std::string table;
  if (!s.rows.empty()) {
    table = summary();
  } else {
    const ProfilerSchedule& sc = s.options.schedule;
    table = "fulgur: TorchProfiler recorded no step in " + std::string(to_string(s.setup.stage)) + ": it ran " +
             std::to_string(s.step) + " step(s), and the schedule records from step " +
             std::to_string(sc.skip_first + sc.wait + sc.warmup + 1) + " on (after skip_first + wait + warmup); shorten "
             "it.\n";
  }
  if (!s.table_path.empty()) profiling::append_report(s.table_path, table);
  if (s.setup.global_rank == 0) std::cout << table << std::flush;
}

std::vector<TorchProfiler::OperatorRow> TorchProfiler::operators() const {
  std::vector<OperatorRow> rows;
  for (const auto& [name, row] : state_->rows) rows.push_back(row);
  std::string key = state_->options.sort_by_key;
  if (key.empty()) key = torch::cuda::is_available() ? "self_cuda_time_total" : "self_cpu_time_total";
  auto value = [&](const OperatorRow& r) {
    if (key == "self_cpu_time_total") return r.self_cpu_ns;
    if (key == "self_cuda_time_total") return r.self_device_ns;
    if (key == "cpu_time_total") return r.cpu_total_ns;
    if (key == "cuda_time_total") return r.device_total_ns;
    return r.calls;
  };
  std::stable_sort(rows.begin(), rows.end(), [&](const OperatorRow& a, const OperatorRow& b) { return value(a) > value(b); });
  return rows;
}

std::string TorchProfiler::summary() const {
  const std::vector<OperatorRow> rows = operators();
  const bool device = std::any_of(rows.begin(), rows.end(), [](const OperatorRow& r) { return r.device_total_ns > 0; });
  const bool flops = std::any_of(rows.begin(), rows.end(), [](const OperatorRow& r) { return r.flops > 0; });
  std::int64_t self_cpu = 0, self_device = 0;
  std::size_t width = 4;
  for (const OperatorRow& r : rows) {
    self_cpu += r.self_cpu_ns;
    self_device += r.self_device_ns;
    width = std::max(width, std::min<std::size_t>(r.name.size(), 60));
  }
  std::vector<std::string> header = {"Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"};
  if (device) header.insert(header.end(), {"Self CUDA", "Self CUDA %", "CUDA total", "CUDA time avg"});
  header.push_back("# of Calls");
  if (flops) header.push_back("Total MFLOPs");
  std::vector<std::vector<std::string>> lines{header};
  const std::size_t limit = state_->options.row_limit < 0 ? rows.size()
                                                          : std::min(rows.size(), static_cast<std::size_t>(state_->options.row_limit));
  for (std::size_t i = 0; i < limit; ++i) {
    const OperatorRow& r = rows[i];
    std::string name = r.name.size() > 60 ? r.name.substr(0, 57) + "..." : r.name;
    std::vector<std::string> line = {name, percent_text(r.self_cpu_ns, self_cpu), time_text(r.self_cpu_ns),
                                     percent_text(r.cpu_total_ns, self_cpu), time_text(r.cpu_total_ns),
                                     time_text(r.calls ? r.cpu_total_ns / r.calls : 0)};
    if (device)
      line.insert(line.end(), {time_text(r.self_device_ns), percent_text(r.self_device_ns, self_device),
                               time_text(r.device_total_ns), time_text(r.calls ? r.device_total_ns / r.calls : 0)});
    line.push_back(std::to_string(r.calls));
    if (flops) {
      char text[32];
      std::snprintf(text, sizeof text, "%.3f", static_cast<double>(r.flops) / 1e6);
      line.emplace_back(text);
    }
    lines.push_back(std::move(line));
  }
  std::vector<std::size_t> widths(header.size(), 0);
  for (const auto& line : lines)
    for (std::size_t c = 0; c < line.size(); ++c) widths[c] = std::max(widths[c], line[c].size());
  std::string rule;
  for (std::size_t w : widths) rule += std::string(w, '-') + "  ";
  rule.resize(rule.size() - 2);
  rule += '\n';
  std::string out = std::string(to_string(state_->setup.stage)) + " TorchProfiler report (rank " +
                    std::to_string(state_->setup.global_rank) + ")\n" + rule;
  for (std::size_t l = 0; l < lines.size(); ++l) {
    for (std::size_t c = 0; c < lines[l].size(); ++c) {
      const std::string& cell = lines[l][c];
      const std::string pad(widths[c] - cell.size(), ' ');
      out += (c == 0 ? cell + pad : pad + cell) + (c + 1 < lines[l].size() ? "  " : "\n");
    }
    if (l == 0) out += rule;
  }
  out += rule + "Self CPU time total: " + time_text(self_cpu) + "\n";
  if (device) out += "Self CUDA time total: " + time_text(self_device) + "\n";
  return out;
}

}  // namespace fulgur
