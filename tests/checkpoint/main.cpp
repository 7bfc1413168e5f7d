// The main of the checkpoint I/O tests (Catch itself: tests/catch_implementation.cpp). A test that
// cannot make the condition it checks (no way to make a read-only folder as root, no tmpfs to
// fill) calls skip(): a warning says why, and the run exits with 77, which ctest reports as
// skipped rather than passed.
#include <catch2/catch.hpp>

#include "catch_session.hpp"

#include <string>

namespace checkpoint_tests {
namespace {
bool skipped = false;
}
void skip(const std::string& why) {
  skipped = true;
  WARN("SKIPPED: " << why);
}
}  // namespace checkpoint_tests

int main(int argc, char* argv[]) {
  const int failures = fulgur_tests::run_catch_session(argc, argv);
  if (failures == 0 && checkpoint_tests::skipped) return 77;
  return failures;
}
