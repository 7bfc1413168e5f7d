#!/usr/bin/env bash
# Quality gates beyond the test suite (docs/development.md says what each covers and why):
#
#   scripts/check.sh asan    ASan + UBSan build (build-asan/): unit, checkpoint and distributed tests
#   scripts/check.sh tsan    TSan build (build-tsan/): DDP, sharded, launcher and fault tests on 2 ranks, DataLoader workers
#   scripts/check.sh clang   clang build (build-clang/): library, tests, compile-fail suite, add_subdirectory consumer
#   scripts/check.sh tidy    clang-tidy (.clang-tidy) over src/ and include/ (build-tidy/: configured only)
#   scripts/check.sh fuzz    the readers of outside input fuzzed for a fixed budget (FULGUR_FUZZ_SECONDS
#                            each, default 120): the seeded mutation fuzzers (checkpoint, npy, tokens, cli),
#                            then the libFuzzer targets with ASan + UBSan in the clang build (build-clang/)
#   scripts/check.sh all     the five, in that order
#
# Extra arguments go to ctest (e.g. -R 'sharded' to narrow a sanitizer run).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${FULGUR_JOBS:-$(nproc)}"
supp="$root/scripts/sanitizers"

usage() { sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 1 ]] || usage
job="$1"; shift
# clang-16 comes with the test suite's set-up (the compile-fail cases use it); clang-tidy with the job that runs it.
extra_debs=""
[[ "$job" == tidy || "$job" == all ]] && extra_debs="clang-tidy-16"
FULGUR_EXTRA_DEBS="$extra_debs" bash "$root/scripts/setup.sh"

# configure_and_build DIR TARGETS... -- CMAKE_ARGS...
configure_and_build() {
  local dir="$1"; shift
  local targets=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do targets+=("$1"); shift; done
  shift
  cmake -S "$root" -B "$dir" -G Ninja -DFULGUR_BUILD_BENCH=OFF -DFULGUR_BUILD_EXAMPLES=OFF "$@"
  cmake --build "$dir" -j "$jobs" ${targets[@]+--target "${targets[@]}"}
}

# The test binaries a sanitizer run needs (not the compile-fail twins or the package consumers).
sanitized_targets=(fulgur_concept_tests fulgur_unit_tests ddp_worker sharded_worker fulgur_checkpoint_io_tests fulgur_checkpoint_fuzz
                   fulgur_interrupt_probe fulgur_event_file_writer)

run_asan() {
  local dir="$root/build-asan"
  configure_and_build "$dir" "${sanitized_targets[@]}" -- -DCMAKE_BUILD_TYPE=Debug "-DFULGUR_SANITIZE=address;undefined"
  # ASan stops at the first error, UBSan too (-fno-sanitize-recover); LSan checks every process at exit.
  export ASAN_OPTIONS="detect_leaks=1:strict_init_order=1:detect_stack_use_after_return=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" -E '^(compile_fail|package|docs|gpu)\.' "$@"
}

run_tsan() {
  local dir="$root/build-tsan"
  configure_and_build "$dir" fulgur_unit_tests ddp_worker sharded_worker fulgur_tsan_canary -- \
    -DCMAKE_BUILD_TYPE=Debug -DFULGUR_SANITIZE=thread
  # ignore_noninstrumented_modules: the prebuilt LibTorch's own memory accesses are not checked (its
  # atomics are invisible, so each object it hands between threads reads as a race: 1,387 reports,
  # docs/development.md); its locks still order fulgur's accesses. sanitizer.tsan_canary shows that
  # a race in instrumented code on a LibTorch thread is still reported.
  export TSAN_OPTIONS="halt_on_error=1:ignore_noninstrumented_modules=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp"
  # The threads fulgur runs: the DDP reducer's hooks and its Gloo work, the store heartbeat and the
  # stuck-rank diagnosis, the launcher's signal forwarding and its workers' reaping, the DataLoader's
  # workers (their hand-off, errors, early exits and two epochs at once).
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" \
    -R '^(sanitizer\.|unit\..*DDP|unit\.data loader:|distributed\.(torchrun|fault|launcher)\.|distributed\.sharded\..*ranks2$)' "$@"
}

run_clang() {
  local dir="$root/build-clang"
  CXX=clang++-16 configure_and_build "$dir" -- -DCMAKE_BUILD_TYPE=Release
  # The add_subdirectory consumer (libfulgur again, Debug and CMake's unity batches) is built here, under
  # clang, rather than in every test run (tests/package/CMakeLists.txt).
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" -E '^(bench|example)\.|^package\.(install|docs|find)' "$@"
}

run_tidy() {
  # Configured only, for its compile commands; without the precompiled header, which is GCC's.
  local dir="$root/build-tidy"
  cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON >/dev/null
  local sources
  mapfile -t sources < <(cd "$root" && git ls-files 'src/*.cpp' | grep -v '^src/distributed/gloo_declarations/')
  # clang-tidy reads .clang-tidy; its HeaderFilterRegex brings include/fulgur into every source's report.
  (cd "$root" && printf '%s\n' "${sources[@]}" |
     xargs -P "$jobs" -n 1 clang-tidy-16 -p "$dir" --quiet --warnings-as-errors='*' --extra-arg=-Wno-unknown-warning-option)
  echo "clang-tidy: ${#sources[@]} sources (and the headers they include) clean"
}

# run_libfuzzer NAME BINARY TIMEOUT: $seconds of libFuzzer from $artifacts/NAME-corpus; its summary (runs,
# coverage, features), or on a finding the end of its report and where the input is.
run_libfuzzer() {
  local name="$1" binary="$2" timeout="$3" log="$artifacts/$1.log"
  if ! "$binary" -max_total_time="$seconds" -timeout="$timeout" -rss_limit_mb=4096 \
      -artifact_prefix="$artifacts/$name-" -print_final_stats=1 "$artifacts/$name-corpus" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "$name libFuzzer: FAILED, the input and the log in $artifacts"
    exit 1
  fi
  grep -E '^(#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::new_units_added|Done)' "$log" |
    sed "s/^/$name libFuzzer: /"
}

run_fuzz() {
  local seconds="${FULGUR_FUZZ_SECONDS:-120}" dir="$root/build-clang" artifacts
  artifacts="$(mktemp -d)"
  export FULGUR_FUZZ_ARTIFACTS="$artifacts"
  # The seeded mutation fuzzers, in the default build (GCC): fixed inputs per seed, reproducible.
  cmake --build "$root/build" -j "$jobs" --target fulgur_checkpoint_fuzz fulgur_reader_fuzz
  "$root/build/tests/checkpoint/fulgur_checkpoint_fuzz" "$seconds" 11
  for target in npy tokens cli; do "$root/build/tests/fuzz/fulgur_reader_fuzz" "$target" "$seconds" 11; done
  # libFuzzer, coverage-guided, under ASan + UBSan, from the mutation fuzzers' seeds.
  CXX=clang++-16 configure_and_build "$dir" fulgur_checkpoint_libfuzzer fulgur_npy_libfuzzer fulgur_tokens_libfuzzer \
    fulgur_cli_libfuzzer -- -DCMAKE_BUILD_TYPE=Release
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:suppressions=$supp/ubsan.supp"
  export ASAN_OPTIONS="detect_leaks=1"
  export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"  # LibTorch's zip reader (lsan.supp says why)
  for target in npy tokens cli; do
    mkdir -p "$artifacts/$target-corpus"
    "$root/build/tests/fuzz/fulgur_reader_fuzz" "$target" --write-seeds "$artifacts/$target-corpus"
    run_libfuzzer "$target" "$dir/tests/fuzz/fulgur_${target}_libfuzzer" 20
  done
  mkdir -p "$artifacts/checkpoint-corpus"
  "$root/build/tests/checkpoint/fulgur_checkpoint_fuzz" --write-seeds "$artifacts/checkpoint-corpus"
  run_libfuzzer checkpoint "$dir/tests/checkpoint/fulgur_checkpoint_libfuzzer" 60
  rm -rf "$artifacts"
  echo "fuzz: every target ran ${seconds} s with 0 crashes"
}

case "$job" in
  asan) run_asan "$@" ;;
  tsan) run_tsan "$@" ;;
  clang) run_clang "$@" ;;
  tidy) run_tidy ;;
  fuzz) run_fuzz ;;
  all) run_tidy; run_asan "$@"; run_tsan "$@"; run_clang "$@"; run_fuzz ;;
  *) usage ;;
esac
