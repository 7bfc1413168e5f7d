// GradientAccumulationScheduler (include/fulgur/callbacks/gradient_accumulation_scheduler.hpp):
// lightning/pytorch/callbacks/gradient_accumulation_scheduler.py, its checks and messages.
#include "fulgur/callbacks/gradient_accumulation_scheduler.hpp"

#include <algorithm>
#include <string>

#include "fulgur/errors.hpp"

namespace fulgur {
namespace {

template <class Pick>
std::string python_list(const std::map<std::int64_t, std::int64_t>& scheduling, Pick pick) {
  std::string out = "[";
  for (const auto& item : scheduling) out += (out.size() > 1 ? ", " : "") + std::to_string(pick(item));
  return out + "]";
}

}  // namespace

GradientAccumulationScheduler::GradientAccumulationScheduler(std::map<std::int64_t, std::int64_t> scheduling)
    : scheduling_(std::move(scheduling)) {
  if (scheduling_.empty()) throw MisconfigurationError("Empty dict cannot be interpreted correct");
  if (std::any_of(scheduling_.begin(), scheduling_.end(), [](const auto& item) { return item.first < 0; }))
    throw MisconfigurationError("Epoch should be an int greater than or equal to 0. Got " +
                                python_list(scheduling_, [](const auto& item) { return item.first; }) + ".");
  if (std::any_of(scheduling_.begin(), scheduling_.end(), [](const auto& item) { return item.second < 1; }))
    throw MisconfigurationError("Accumulation factor should be an int greater than 0. Got " +
                                python_list(scheduling_, [](const auto& item) { return item.second; }) + ".");
  scheduling_.try_emplace(0, 1);  // epochs before the first one given: no accumulation
}

std::int64_t GradientAccumulationScheduler::accumulate_grad_batches(std::int64_t epoch) const {
  auto after = scheduling_.upper_bound(epoch);  // the last scheduled epoch <= epoch is the one before
  return after == scheduling_.begin() ? 1 : std::prev(after)->second;
}

bool GradientAccumulationScheduler::going_to_accumulate_grad_batches() const {
  return std::any_of(scheduling_.begin(), scheduling_.end(), [](const auto& item) { return item.second > 1; });
}

void GradientAccumulationScheduler::check(TrainerView& trainer, bool automatic_optimization) {
  if (!automatic_optimization)
    throw MisconfigurationError(
        "Automatic gradient accumulation and the `GradientAccumulationScheduler` is not supported for manual "
        "optimization. Please remove the callback or switch to automatic optimization.");
  if (trainer.config().accumulate_grad_batches != 1)
    throw MisconfigurationError(
        "You have set `accumulate_grad_batches` and are using the `GradientAccumulationScheduler` callback. Either "
        "remove `accumulate_grad_batches` from the Trainer or remove the callback. (TrainerConfig::"
        "accumulate_grad_batches = " + std::to_string(trainer.config().accumulate_grad_batches) + ")");
}

void GradientAccumulationScheduler::on_train_epoch_start(TrainerView& trainer) {
  trainer.set_accumulate_grad_batches(accumulate_grad_batches(trainer.current_epoch()));
  changed_ = true;
}

void GradientAccumulationScheduler::teardown(TrainerView& trainer) {
  if (std::exchange(changed_, false)) trainer.set_accumulate_grad_batches(1);
}

}  // namespace fulgur
