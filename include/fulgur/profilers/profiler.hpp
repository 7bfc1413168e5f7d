#pragma once
// What makes a type a profiler for fulgur::Trainer<A, S, P, Callbacks...>: a Trainer argument like a
// callback (Lightning's `profiler=`), at most one per Trainer, with Lightning's Profiler methods:
//
//   void start(fulgur::Action);             an action begins (its name: action.name())
//   void stop(fulgur::Action);              ... and ends; must not throw
//   void set_up(const fulgur::ProfilerSetup&);  optional: a stage starts (fit, validate, test, predict)
//   void describe();                        optional: the stage ended; report
//
// Without a profiler, no timing code is compiled into the loops at all. Torch-free.
#include <concepts>
#include <string>
#include <type_traits>
#include <utility>

#include "fulgur/profilers/action.hpp"
#include "fulgur/stage.hpp"

namespace fulgur {

/// What a profiler learns when a stage starts (Lightning's Profiler.setup(stage, local_rank, log_dir)).
struct ProfilerSetup {
  Stage stage = Stage::fit;
  int global_rank = 0;
  int local_rank = 0;
  int world_size = 1;
  /// Where a profiler without a dirpath writes: the first logger's log_dir, else default_root_dir.
  std::string log_dir{};
};

template <class P>
concept profiler = std::is_class_v<P> && requires(P& p, Action action) {
  p.start(action);
  p.stop(action);
};

namespace profiling {

/// Times one action for the scope's life (on the way out of an exception too), or until end().
template <class P>
class Scope {
 public:
  Scope(P& profiler, Action action) : profiler_(&profiler), action_(action) { profiler.start(action); }
  /// Times nothing when `profiler` is null.
  Scope(P* profiler, Action action) : profiler_(profiler), action_(action) {
    if (profiler_ != nullptr) profiler_->start(action);
  }
  ~Scope() { end(); }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  void end() noexcept {
    if (profiler_ != nullptr) std::exchange(profiler_, nullptr)->stop(action_);
  }

 private:
  P* profiler_;
  Action action_;
};

/// What a profiling point is when the Trainer has no profiler: nothing (a destructor of its own only so
/// that `auto timed = ...` of it is not an unused variable).
struct NoScope {
  ~NoScope() {}  // NOLINT(modernize-use-equals-default): see above
  void end() noexcept {}
};

}  // namespace profiling
}  // namespace fulgur
