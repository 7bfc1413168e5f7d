// bench_matrix: every compatible (accelerator, strategy, precision) of fulgur's shipped policy
// lists on three workloads, each beside the same training written by hand (bench/matrix.hpp).
// `--benchmark_filter=gpt/cpu` picks a subset; `--threads=N` (or FULGUR_BENCH_THREADS=N) sets
// LibTorch's intra-op threads (default 1; 0: LibTorch's default). A misspelt flag, or a row that
// fails, makes the exit status 1.
#include <benchmark/benchmark.h>

#include "../matrix.hpp"
#include "workloads.hpp"

int main(int argc, char** argv) {
  fulgur::bench::register_mlp();
  fulgur::bench::register_cnn();
  fulgur::bench::register_gpt();
  return fulgur::bench::run_matrix(argc, argv);
}
