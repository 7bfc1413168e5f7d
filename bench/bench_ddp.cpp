// 2-rank CPU DDP step time and scaling, side by side in one run:
//   fulgur_1proc_us  one process, batch 2B, 2 intra-op threads (the same work, no communication)
//   fulgur_ddp_us    fulgur DDPStrategy (Gloo), 2 ranks x batch B, 1 thread each
//   python_ddp_us    torch.nn.parallel.DistributedDataParallel (Gloo), 2 ranks x batch B, 1 thread each
//   fulgur_zero1_us  fulgur ShardedStrategy<1> (ZeRO stage 1, Gloo), as fulgur_ddp_us; zero1_vs_ddp its ratio
//   fulgur_zero2_us  fulgur ShardedStrategy<2> (ZeRO stage 2), likewise; zero2_vs_ddp
// Each iteration runs the five (their order rotates), each reporting its own mean step time
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
double run_and_read(const std::string& command) {
  FILE* pipe = ::popen((command + " 2>/dev/null").c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run " + command);
  std::array<char, 512> line{};
  double value = -1;
  while (std::fgets(line.data(), line.size(), pipe))
    if (std::sscanf(line.data(), "step_us %lf", &value) == 1) break;
  while (std::fgets(line.data(), line.size(), pipe)) {
  }
  ::pclose(pipe);
  if (value < 0) throw std::runtime_error("no step_us from: " + command);
  return value;
}

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
  std::vector<double> one, ours, python, zero1, zero2, ratios;
  int rotation = 0;
  for (auto _ : state) {
    double t1 = 0, t2 = 0, t3 = 0, t4 = 0, t5 = 0;
    for (int k = 0; k < 5; ++k) {
      switch ((rotation + k) % 5) {
        case 0: t1 = run_and_read(single); break;
        case 1: t2 = run_and_read(fulgur_ddp); break;
        case 2: t3 = run_and_read(python_ddp); break;
        case 3: t4 = run_and_read(fulgur_zero1); break;
        case 4: t5 = run_and_read(fulgur_zero2); break;
      }
    }
    ++rotation;
    one.push_back(t1);
    ours.push_back(t2);
    python.push_back(t3);
    zero1.push_back(t4);
    zero2.push_back(t5);
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
  state.counters["scaling"] = median(one) / median(ours);
}
}  // namespace

BENCHMARK(BM_ddp_side_by_side)->UseManualTime()->Iterations(7)->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
