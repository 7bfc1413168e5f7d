#pragma once
// What the multi-process test workers share: each rank checks its own results; a failure prints
// "rank r FAILED: <why>" (which fails the ctest case) and makes the worker exit non-zero; global
// rank 0 prints "PASS <scenario>" when every check on it passed.
#include <fulgur/fulgur.hpp>

#include <chrono>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

namespace worker {

inline int failures = 0;
inline int my_rank = 0;

inline void check(bool ok, const std::string& what) {
  if (!ok) {
    std::cerr << "rank " << my_rank << " FAILED: " << what << std::endl;
    ++failures;
  }
}

/// DDPOptions with the collective timeout of FULGUR_TEST_TIMEOUT_MS, if set.
inline fulgur::DDPOptions options(fulgur::DDPOptions o = {}) {
  if (const char* t = std::getenv("FULGUR_TEST_TIMEOUT_MS")) o.timeout = std::chrono::milliseconds(std::atoi(t));
  return o;
}

/// Runs `dispatch(scenario)` (false: no such scenario), reports, and returns the exit code.
template <class Dispatch>
int run(const std::string& scenario, const char* usage, Dispatch&& dispatch) {
  if (const char* r = std::getenv("RANK")) my_rank = std::atoi(r);
  try {
    if (!dispatch(scenario)) {
      std::cerr << usage << "\n";
      return 2;
    }
  } catch (const std::exception& e) {
    std::cerr << "rank " << my_rank << " FAILED with an exception: " << e.what() << std::endl;
    return 1;
  }
  if (failures) return 1;
  if (my_rank == 0) std::cout << "PASS " << scenario << std::endl;
  return 0;
}

}  // namespace worker
