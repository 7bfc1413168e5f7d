// 2-rank CPU DDP step time and scaling, side by side in one run:
//   fulgur_1proc_us  one process, batch 2B, 2 intra-op threads (the same work, no communication)
//   fulgur_ddp_us    fulgur DDPStrategy (Gloo), 2 ranks x batch B, 1 thread each
//   python_ddp_us    torch.nn.parallel.DistributedDataParallel (Gloo), 2 ranks x batch B, 1 thread each
//   fulgur_zero1_us  fulgur ShardedStrategy<1> (ZeRO stage 1, Gloo), as fulgur_ddp_us; zero1_vs_ddp its ratio
//   fulgur_zero2_us  fulgur ShardedStrategy<2> (ZeRO stage 2), likewise; zero2_vs_ddp
//   fulgur_zero3_us  fulgur ShardedStrategy<3> (parameters sharded, each Linear a unit), likewise; zero3_vs_ddp
//   python_fsdp2_us  torch.distributed.fsdp.fully_shard (FSDP2) on each Linear and the root, Gloo, CPU;
//                    zero3_vs_fsdp2 = fulgur_zero3_us / python_fsdp2_us
// Each iteration runs the seven (their order rotates), each reporting its own mean step time
// between barriers after a warm-up; counters are medians over iterations. ratio_vs_python is
// fulgur_ddp_us / python_ddp_us (goal: <= 1); scaling is fulgur_1proc_us / fulgur_ddp_us.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef FULGUR_BENCH_DDP_WORKER
#error "FULGUR_BENCH_DDP_WORKER must name the worker binary"
#endif

namespace {
struct Reading {
  double step_us = -1;
  double peak_bytes = -1, step_peak_bytes = -1;  // fulgur's workers: CPU tensor memory of rank 0
};
Reading run_and_read_all(const std::string& command) {
  FILE* pipe = ::popen((command + " 2>/dev/null").c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run " + command);
  std::array<char, 512> line{};
  Reading r;
  while (std::fgets(line.data(), line.size(), pipe)) {
    std::sscanf(line.data(), "step_us %lf", &r.step_us);
    std::sscanf(line.data(), "peak_bytes %lf", &r.peak_bytes);
    std::sscanf(line.data(), "step_peak_bytes %lf", &r.step_peak_bytes);
  }
  ::pclose(pipe);
  if (r.step_us < 0) throw std::runtime_error("no step_us from: " + command);
  return r;
}
double run_and_read(const std::string& command) { return run_and_read_all(command).step_us; }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void BM_ddp_side_by_side(benchmark::State& state) {
  const std::string torchrun = FULGUR_BENCH_TORCHRUN;
  const std::string single = "OMP_NUM_THREADS=2 " + std::string(FULGUR_BENCH_DDP_WORKER);
  const std::string fulgur_ddp =
      "OMP_NUM_THREADS=1 " + torchrun + " --nproc-per-node=2 --master-port=29881 --no-python " FULGUR_BENCH_DDP_WORKER;
  const std::string fulgur_zero1 = "FULGUR_BENCH_STRATEGY=zero1 OMP_NUM_THREADS=1 " + torchrun +
                                   " --nproc-per-node=2 --master-port=29883 --no-python " FULGUR_BENCH_DDP_WORKER;
  const std::string python_ddp =
      "OMP_NUM_THREADS=1 " + torchrun + " --nproc-per-node=2 --master-port=29882 " FULGUR_BENCH_PYTHON_DDP;
  const std::string fulgur_zero2 = "FULGUR_BENCH_STRATEGY=zero2 OMP_NUM_THREADS=1 " + torchrun +
                                   " --nproc-per-node=2 --master-port=29884 --no-python " FULGUR_BENCH_DDP_WORKER;
  const std::string fulgur_zero3 = "FULGUR_BENCH_STRATEGY=zero3 OMP_NUM_THREADS=1 " + torchrun +
                                   " --nproc-per-node=2 --master-port=29885 --no-python " FULGUR_BENCH_DDP_WORKER;
  const std::string python_fsdp2 =
      "OMP_NUM_THREADS=1 " + torchrun + " --nproc-per-node=2 --master-port=29886 " FULGUR_BENCH_PYTHON_FSDP2;
  std::vector<double> one, ours, python, zero1, zero2, zero3, fsdp2, ratios;
  int rotation = 0;
  for (auto _ : state) {
    double t1 = 0, t2 = 0, t3 = 0, t4 = 0, t5 = 0, t6 = 0, t7 = 0;
    for (int k = 0; k < 7; ++k) {
      switch ((rotation + k) % 7) {
        case 0: t1 = run_and_read(single); break;
        case 1: t2 = run_and_read(fulgur_ddp); break;
        case 2: t3 = run_and_read(python_ddp); break;
        case 3: t4 = run_and_read(fulgur_zero1); break;
        case 4: t5 = run_and_read(fulgur_zero2); break;
        case 5: t6 = run_and_read(fulgur_zero3); break;
        case 6: t7 = run_and_read(python_fsdp2); break;
      }
    }
    ++rotation;
    one.push_back(t1);
    ours.push_back(t2);
    python.push_back(t3);
    zero1.push_back(t4);
    zero2.push_back(t5);
    zero3.push_back(t6);
    fsdp2.push_back(t7);
    ratios.push_back(t2 / t3);
    state.SetIterationTime(t2 * 1e-6);
  }
  state.counters["fulgur_1proc_us"] = median(one);
  state.counters["fulgur_ddp_us"] = median(ours);
  state.counters["python_ddp_us"] = median(python);
  state.counters["ratio_vs_python"] = median(ratios);
  state.counters["fulgur_zero1_us"] = median(zero1);
  state.counters["zero1_vs_ddp"] = median(zero1) / median(ours);
  state.counters["fulgur_zero2_us"] = median(zero2);
  state.counters["zero2_vs_ddp"] = median(zero2) / median(ours);
  state.counters["fulgur_zero3_us"] = median(zero3);
  state.counters["zero3_vs_ddp"] = median(zero3) / median(ours);
  state.counters["python_fsdp2_us"] = median(fsdp2);
  state.counters["zero3_vs_fsdp2"] = median(zero3) / median(fsdp2);
  state.counters["scaling"] = median(one) / median(ours);
}

// The GPT-style model (bench/matrix/gpt.hpp at 4.2M parameters, AdamW, FULGUR_BENCH_MODEL=gpt), 2
// ranks on Gloo, 1 thread each: step time and the most CPU tensor memory a rank held, per strategy.
//   <row>_us            mean step time; <row>_vs_ddp its ratio to fulgur DDP's
//   <row>_peak_mib      most tensor memory on rank 0 over the whole run (building the model, set-up)
//   <row>_step_peak_mib most tensor memory on rank 0 during the timed steps
// Rows: ddp, zero1, zero2, zero3 (each block a unit), zero3_meta (built on the meta device), and
// python_ddp / python_fsdp2 (fully_shard on each block and the root; step time only: Python's CPU
// allocator keeps no count).
void BM_gpt_sharded_side_by_side(benchmark::State& state) {
  const std::string torchrun = FULGUR_BENCH_TORCHRUN;
  auto fulgur_row = [&](const std::string& strategy, int port) {
    return "FULGUR_BENCH_MODEL=gpt FULGUR_BENCH_STRATEGY=" + strategy + " OMP_NUM_THREADS=1 " + torchrun +
           " --nproc-per-node=2 --master-port=" + std::to_string(port) + " --no-python " FULGUR_BENCH_DDP_WORKER;
  };
  auto python_row = [&](const std::string& script, int port) {
    return "FULGUR_BENCH_MODEL=gpt OMP_NUM_THREADS=1 " + torchrun + " --nproc-per-node=2 --master-port=" +
           std::to_string(port) + " " + script;
  };
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"ddp", fulgur_row("ddp", 29887)},
      {"zero1", fulgur_row("zero1", 29888)},
      {"zero2", fulgur_row("zero2", 29889)},
      {"zero3", fulgur_row("zero3", 29890)},
      {"zero3_meta", fulgur_row("zero3-meta", 29891)},
      {"python_ddp", python_row(FULGUR_BENCH_PYTHON_DDP, 29892)},
      {"python_fsdp2", python_row(FULGUR_BENCH_PYTHON_FSDP2, 29893)},
  };
  std::vector<std::vector<Reading>> readings(rows.size());
  int rotation = 0;
  for (auto _ : state) {
    for (std::size_t k = 0; k < rows.size(); ++k) {
      const std::size_t i = (rotation + k) % rows.size();
      readings[i].push_back(run_and_read_all(rows[i].second));
    }
    ++rotation;
    state.SetIterationTime(readings[0].back().step_us * 1e-6);
  }
  auto median_of = [&](std::size_t i, double Reading::*field) {
    std::vector<double> v;
    for (const auto& r : readings[i]) v.push_back(r.*field);
    return median(v);
  };
  const double ddp_us = median_of(0, &Reading::step_us);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::string& name = rows[i].first;
    const double us = median_of(i, &Reading::step_us);
    state.counters[name + "_us"] = us;
    if (i > 0) state.counters[name + "_vs_ddp"] = us / ddp_us;
    if (median_of(i, &Reading::peak_bytes) >= 0) {
      state.counters[name + "_peak_mib"] = median_of(i, &Reading::peak_bytes) / (1 << 20);
      state.counters[name + "_step_peak_mib"] = median_of(i, &Reading::step_peak_bytes) / (1 << 20);
    }
  }
  state.counters["zero3_vs_fsdp2"] = median_of(3, &Reading::step_us) / median_of(6, &Reading::step_us);
}

}  // namespace

BENCHMARK(BM_ddp_side_by_side)->UseManualTime()->Iterations(7)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_gpt_sharded_side_by_side)->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
