// Linked into every benchmark program: a benchmark built for the test suite (FULGUR_BENCH_OPTIMIZED=OFF,
// bench/CMakeLists.txt) says so in its output's context, beside Google Benchmark's own build notes, so
// that its timings are never read as figures.
#include <benchmark/benchmark.h>

#if !FULGUR_BENCH_OPTIMIZED
namespace {
const bool noted = [] {
  benchmark::AddCustomContext("fulgur_bench_build",
                              "-O1 for the test suite (FULGUR_BENCH_OPTIMIZED=OFF): not for figures; "
                              "scripts/bench.sh builds at -O3");
  return true;
}();
}  // namespace
#endif
