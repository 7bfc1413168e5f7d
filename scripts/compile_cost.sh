#!/usr/bin/env bash
# What fulgur adds to a user's build: one translation unit that trains a small MLP by hand against
# LibTorch (<torch/torch.h>) against the same with one Trainer and fit (<fulgur/fulgur.hpp>), compiled
# with the library's Release flags, no ccache, no precompiled header. The two are compiled in turn,
# REPEATS times (default 5), and timed in CPU seconds (user + sys of the compiler), so that other work
# on the machine moves both alike; the figure is the median of the per-pair ratios (issue 9's goal:
# <= 1.3).
#   scripts/compile_cost.sh [--against REV]
# --against REV also compiles the fulgur TU against the headers of git revision REV (a temporary
# worktree), in the same rotation: the before/after of a change to the headers.
# CXX picks the compiler (default c++, here g++ 12; e.g. CXX=clang++-16); EXTRA_FLAGS adds flags to
# both TUs (e.g. GCC's garbage-collector parameters, docs/benchmarks.md).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
repeats="${REPEATS:-5}"
against=""
case "${1:-}" in
  --against) against="${2:?--against needs a git revision}" ;;
  "") ;;
  -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "scripts/compile_cost.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac
if ! [[ "$repeats" =~ ^[1-9][0-9]*$ ]]; then
  echo "scripts/compile_cost.sh: REPEATS must be a positive whole number, got '$repeats'" >&2
  exit 2
fi
python="$root/.venv/bin/python"
torch_include=$("$python" -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'include'))")
work=$(mktemp -d)
cleanup() {
  if [ -n "$against" ] && [ -d "$work/against" ]; then git -C "$root" worktree remove --force "$work/against" >/dev/null 2>&1 || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
if [ -n "$against" ]; then
  git -C "$root" worktree add --detach "$work/against" "$against" >/dev/null 2>&1 \
    || { echo "scripts/compile_cost.sh: cannot check out '$against'" >&2; exit 2; }
fi
cat >"$work/model.hpp" <<'CPP'
#include <torch/torch.h>
struct MlpImpl : torch::nn::Module {
  MlpImpl() : fc1(register_module("fc1", torch::nn::Linear(32, 64))), fc2(register_module("fc2", torch::nn::Linear(64, 10))) {}
  at::Tensor forward(const at::Tensor& x) { return fc2(torch::relu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};
CPP
cat >"$work/by_hand.cpp" <<'CPP'
#include "model.hpp"
struct Mlp2 : MlpImpl {};
int main() {
  auto model = std::make_shared<MlpImpl>();
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  for (int epoch = 0; epoch < 2; ++epoch)
    for (int i = 0; i < 10; ++i) {
      auto x = torch::randn({64, 32});
      auto y = torch::randint(10, {64}, at::kLong);
      optimizer.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model->forward(x), y);
      loss.backward();
      optimizer.step();
      if (i % 5 == 0) std::printf("epoch %d step %d loss %f\n", epoch, i, loss.item<float>());
    }
}
CPP
cat >"$work/with_fulgur.cpp" <<'CPP'
#include <fulgur/fulgur.hpp>
#include "model.hpp"
struct Net : MlpImpl {
  at::Tensor training_step(const fulgur::data::Batch& b, std::int64_t) {
    return torch::nn::functional::cross_entropy(forward(b.input), b.target);
  }
  std::unique_ptr<torch::optim::Optimizer> configure_optimizers() {
    return std::make_unique<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  }
};
int main() {
  auto model = std::make_shared<Net>();
  fulgur::data::TensorLoader loader(torch::randn({640, 32}), torch::randint(10, {640}, at::kLong), {.batch_size = 64});
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision> trainer({.max_epochs = 2});
  trainer.fit(model, loader);
}
CPP
cxx="${CXX:-c++}"
command -v "$cxx" >/dev/null || { echo "scripts/compile_cost.sh: no compiler '$cxx' (CXX)" >&2; exit 2; }
read -r -a extra <<<"${EXTRA_FLAGS:-}"
flags=(-std=c++20 -O3 -DNDEBUG "${extra[@]}" -isystem "$torch_include"
       -isystem "$torch_include/torch/csrc/api/include" -isystem /usr/local/cuda/include)
# CPU seconds (user + sys) of one compile of $work/$1 with fulgur's headers from $2.
cpu_seconds() {
  local out
  out=$( { /usr/bin/time -f "%U %S" "$cxx" "${flags[@]}" -I"$2" -c "$work/$1" -o "$work/$1.o"; } 2>&1 | tail -1)
  "$python" -c "import sys; u, s = map(float, sys.argv[1:3]); print(f'{u + s:.2f}')" $out
}
hand=() fulgur=() before=()
for _ in $(seq "$repeats"); do
  hand+=("$(cpu_seconds by_hand.cpp "$root/include")")
  fulgur+=("$(cpu_seconds with_fulgur.cpp "$root/include")")
  if [ -n "$against" ]; then before+=("$(cpu_seconds with_fulgur.cpp "$work/against/include")"); fi
done
"$python" - "$repeats" "$(nproc)" "$("$cxx" --version | head -1)${EXTRA_FLAGS:+ $EXTRA_FLAGS}" "${against:-}" "${hand[*]}" "${fulgur[*]}" "${before[*]:-}" <<'PY'
import statistics, sys
repeats, cores, compiler, against = sys.argv[1:5]
hand, fulgur = [list(map(float, a.split())) for a in sys.argv[5:7]]
before = list(map(float, sys.argv[7].split())) if against else []
median = statistics.median
print(f"compile CPU seconds (user + sys), median of {repeats} rotations, {cores} cores, {compiler}:")
print(f"  by hand against <torch/torch.h>:   {median(hand):.2f}  ({' '.join(f'{t:.1f}' for t in hand)})")
print(f"  one Trainer + fit (fulgur.hpp):    {median(fulgur):.2f}  ({' '.join(f'{t:.1f}' for t in fulgur)})")
if against:
    print(f"  the same with {against}'s headers: {median(before):.2f}  ({' '.join(f'{t:.1f}' for t in before)})")
print(f"  ratio fulgur / by hand: {median([f / h for f, h in zip(fulgur, hand)]):.2f} (median of the per-rotation ratios; goal <= 1.3)")
if against:
    print(f"  ratio {against} / by hand: {median([b / h for b, h in zip(before, hand)]):.2f}")
PY
