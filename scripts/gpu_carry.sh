#!/usr/bin/env bash
# Packs what the GPU machine lacks into .carry/ (git-ignored): the machine has CUDA, cmake, ninja and a
# Python with torch and lightning, but no Debian -dev packages. Run here, then name .carry in the
# device tool's `carry` and run scripts/gpu_bench.sh there.
#   .carry/include/boost/{hana,hana.hpp,config,core,...}  Hana is header-only (a BoostConfig for it too)
#   .carry/include/catch2, .carry/lib/cmake/Catch2       Catch2 v2
#   .carry/include/benchmark, .carry/lib/x86_64-linux-gnu/{libbenchmark*,cmake/benchmark}   Google Benchmark
#   --binaries: also .carry/bin/{fulgur_gpu_tests,bench_matrix,bench_fused,bench_pinned_fit,bench_compare_worker} built here (build/, or
#   FULGUR_BUILD_DIR) with a stamp of the torch they were built against, so that gpu_bench.sh runs them there
#   against the same torch instead of spending minutes of device time building (about 15 MB more)
set -euo pipefail
binaries=0
for arg in "$@"; do
  case "$arg" in
    --binaries) binaries=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "scripts/gpu_carry.sh: unknown argument '$arg' (--binaries, --help)" >&2; exit 2 ;;
  esac
done
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
carry="$root/.carry"
build="${FULGUR_BUILD_DIR:-$root/build}"
if [ $binaries = 1 ] && [ ! -f "$build/build.ninja" ] && [ ! -f "$build/Makefile" ]; then
  echo "scripts/gpu_carry.sh: --binaries: no configured build in $build (cmake -S . -B build first, or set FULGUR_BUILD_DIR)" >&2
  exit 2
fi
bash "$root/scripts/setup.sh" >/dev/null
rm -rf "$carry"
mkdir -p "$carry/include/boost" "$carry/lib/cmake"
for part in hana hana.hpp config config.hpp core version.hpp; do cp -r "/usr/include/boost/$part" "$carry/include/boost/"; done
boost_version=$(sed -n 's/^#define BOOST_LIB_VERSION "\(.*\)"/\1/p' /usr/include/boost/version.hpp | tr _ .)
mkdir -p "$carry/lib/cmake/Boost-$boost_version"
cat >"$carry/lib/cmake/Boost-$boost_version/BoostConfig.cmake" <<CONFIG
# Boost's headers that fulgur uses (Hana), carried to a machine without them.
get_filename_component(_carry "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET Boost::headers)
  add_library(Boost::headers INTERFACE IMPORTED)
  set_target_properties(Boost::headers PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "\${_carry}/include")
endif()
set(Boost_INCLUDE_DIRS "\${_carry}/include")
set(Boost_FOUND TRUE)
CONFIG
cat >"$carry/lib/cmake/Boost-$boost_version/BoostConfigVersion.cmake" <<CONFIG
set(PACKAGE_VERSION "$boost_version")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
endif()
CONFIG
cp -r /usr/include/catch2 "$carry/include/"
cp -r /usr/lib/cmake/Catch2 "$carry/lib/cmake/"
cp /usr/lib/libCatch2WithMain.a "$carry/lib/"
cp -r /usr/include/benchmark "$carry/include/"
# Debian's layout (lib/x86_64-linux-gnu), which its benchmark config computes its prefix from.
mkdir -p "$carry/lib/x86_64-linux-gnu/cmake"
cp -a /usr/lib/x86_64-linux-gnu/libbenchmark.so* /usr/lib/x86_64-linux-gnu/libbenchmark_main.a "$carry/lib/x86_64-linux-gnu/"
cp -r /usr/lib/x86_64-linux-gnu/cmake/benchmark "$carry/lib/x86_64-linux-gnu/cmake/"
if [ $binaries = 1 ]; then
  # The benchmarks at -O3 (a build the test suite made has them at -O1: bench/CMakeLists.txt).
  cmake -DFULGUR_BENCH_OPTIMIZED=ON "$build" >/dev/null
  cmake --build "$build" -j "$(nproc)" --target fulgur_gpu_tests bench_matrix bench_fused bench_pinned_fit bench_compare_worker >/dev/null
  mkdir -p "$carry/bin"
  for b in tests/fulgur_gpu_tests bench/bench_matrix bench/bench_fused bench/bench_pinned_fit bench/bench_compare_worker; do cp "$build/$b" "$carry/bin/"; done
  # What gpu_bench.sh compares with the device's torch before it trusts these binaries.
  "$root/.venv/bin/python" -c "import torch; print(torch.__version__)" >"$carry/bin/torch_version"
  git -C "$root" rev-parse --short HEAD >"$carry/bin/revision"
  git -C "$root" diff --quiet HEAD -- include src tests bench || echo "(with uncommitted changes)" >>"$carry/bin/revision"
fi
echo "packed $(du -sh "$carry" | cut -f1) into $carry"
