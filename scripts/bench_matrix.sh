#!/usr/bin/env bash
# The policy matrix: every compatible (accelerator, strategy, precision) on an MLP, a CNN and a small
# GPT, each beside the same training written by hand (bench/matrix.hpp), e.g.
#   bash scripts/bench_matrix.sh --benchmark_filter='gpt/cpu'
# --help prints the usage without building anything.
FULGUR_SCRIPT_NAME=scripts/bench_matrix.sh exec bash "$(dirname "${BASH_SOURCE[0]}")/bench.sh" --target bench_matrix "$@"
