#include "fulgur/callbacks/timer.hpp"

#include <cstdio>
#include <string>

#include "fulgur/errors.hpp"

namespace fulgur {

Timer::Timer(TimerOptions options) : options_(options) {
  if (options_.duration && options_.duration->count() < 0)
    throw MisconfigurationError("Timer's duration must be >= 0 seconds, got " + std::to_string(options_.duration->count()) + ".");
}

void Timer::start(Phase phase) {
  Times& t = times_[index(phase)];
  if (t.start && t.end) t.earlier += std::chrono::duration<double>(*t.end - *t.start).count();
  t.start = clock::now();
  t.end.reset();
}

void Timer::end(Phase phase) { times_[index(phase)].end = clock::now(); }

void Timer::setup(TrainerView&, Stage stage) {
  if (stage == Stage::fit)
    for (Times& t : times_) t = Times{};  // a fit is a fresh run (unless a checkpoint's state follows)
}

namespace {
constexpr const char* phase_names[] = {"train", "validate", "test", "predict"};
}

StateDict Timer::state_dict() const {
  c10::impl::GenericDict elapsed(c10::StringType::get(), c10::FloatType::get());
  for (std::size_t i = 0; i < 4; ++i) elapsed.insert(phase_names[i], time_elapsed(static_cast<Phase>(i)));
  StateDict out;
  out.insert("time_elapsed", elapsed);
  return out;
}

void Timer::load_state_dict(const StateDict& state) {
  if (!state.contains("time_elapsed") || !state.at("time_elapsed").isGenericDict())
    throw CheckpointError("fulgur: the checkpoint's Timer state has no 'time_elapsed' dictionary.");
  const auto elapsed = state.at("time_elapsed").toGenericDict();
  for (std::size_t i = 0; i < 4; ++i)
    if (elapsed.contains(phase_names[i])) times_[i] = Times{{}, {}, elapsed.at(phase_names[i]).toDouble()};
}

double Timer::time_elapsed(Phase phase) const {
  const Times& t = times_[index(phase)];
  if (!t.start) return t.earlier;
  return t.earlier + std::chrono::duration<double>(t.end.value_or(clock::now()) - *t.start).count();
}

std::optional<double> Timer::time_remaining() const {
  if (!options_.duration) return std::nullopt;
  return options_.duration->count() - time_elapsed(Phase::train);
}

void Timer::check(TrainerView& trainer, double limit_seconds) {
  const bool up = trainer.reduce_boolean_decision(time_elapsed(Phase::train) >= limit_seconds, /*all=*/false);
  if (!up) return;
  char text[96];
  std::snprintf(text, sizeof text, "Time limit reached. Elapsed time is %.1f s. Signaling Trainer to stop.",
                time_elapsed(Phase::train));
  if (options_.verbose) trainer.print(text);
  trainer.request_stop(std::string("Timer: ") + text);
}

}  // namespace fulgur
