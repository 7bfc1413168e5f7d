// bench_matrix: every compatible (accelerator, strategy, precision) of fulgur's shipped policy
// lists on three workloads, each beside the same training written by hand (bench/matrix.hpp).
// `--benchmark_filter=gpt/cpu` picks a subset.
#include <benchmark/benchmark.h>

#include "workloads.hpp"

int main(int argc, char** argv) {
  fulgur::bench::register_mlp();
  fulgur::bench::register_cnn();
  fulgur::bench::register_gpt();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
