#!/usr/bin/env bash
# What fulgur adds to a user's build: one translation unit that trains a small MLP by hand against
# LibTorch (<torch/torch.h>) against the same with one Trainer and fit (<fulgur/fulgur.hpp>), each
# compiled REPEATS times (default 3) with the library's Release flags, no ccache, no precompiled
# header. Prints the median seconds and the ratio (issue 9's goal: <= 1.3).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
repeats="${REPEATS:-3}"
python="$root/.venv/bin/python"
torch_include=$("$python" -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'include'))")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
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
flags=(-std=c++20 -O3 -DNDEBUG -I"$root/include" -isystem "$torch_include"
       -isystem "$torch_include/torch/csrc/api/include" -isystem /usr/local/cuda/include)
median_seconds() {
  local file=$1 times=()
  for _ in $(seq "$repeats"); do
    local start end
    start=$(date +%s.%N)
    c++ "${flags[@]}" -c "$work/$file" -o "$work/$file.o"
    end=$(date +%s.%N)
    times+=("$("$python" -c "print(f'{$end - $start:.2f}')")")
  done
  printf '%s\n' "${times[@]}" | sort -n | sed -n "$(( (repeats + 1) / 2 ))p"
}
hand=$(median_seconds by_hand.cpp)
fulgur=$(median_seconds with_fulgur.cpp)
echo "compile seconds (median of $repeats, $(nproc) cores, $(c++ --version | head -1)):"
echo "  by hand against <torch/torch.h>:   $hand"
echo "  one Trainer + fit (fulgur.hpp):    $fulgur"
echo "  ratio: $("$python" -c "print(f'{$fulgur / $hand:.2f}')")"
