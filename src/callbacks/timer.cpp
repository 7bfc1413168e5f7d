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

void Timer::on_fit_start(TrainerView&) {
  for (Times& t : times_) t = Times{};  // a fit is a fresh run
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

void Timer::check(TrainerView& trainer) {
  const bool up = trainer.reduce_boolean_decision(time_elapsed(Phase::train) >= options_.duration->count(), /*all=*/false);
  if (!up) return;
  char text[96];
  std::snprintf(text, sizeof text, "Time limit reached. Elapsed time is %.1f s. Signaling Trainer to stop.",
                time_elapsed(Phase::train));
  if (options_.verbose) trainer.print(text);
  trainer.request_stop(std::string("Timer: ") + text);
}

}  // namespace fulgur
