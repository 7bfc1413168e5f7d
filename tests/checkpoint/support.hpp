#pragma once
// What the checkpoint test files share: a scratch folder, the CheckpointError a call must throw,
// and the skip of main.cpp.
#include <stdlib.h>

#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>

#include <catch2/catch.hpp>

#include "fulgur/detail/files.hpp"
#include "fulgur/errors.hpp"

namespace checkpoint_tests {
void skip(const std::string& why);  // main.cpp: the run exits 77 (skipped)

/// A fresh folder under $TMPDIR (or /tmp), removed with everything in it at the end.
struct TempFolder {
  std::string path;
  explicit TempFolder(const std::string& prefix) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/" + prefix + "-XXXXXX";
    path = ::mkdtemp(pattern.data()) ? pattern : throw std::runtime_error("mkdtemp failed");
  }
  ~TempFolder() { fulgur::detail::remove_tree(path); }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

/// The message of the CheckpointError f throws; a test failure if it throws something else or nothing.
template <class F>
std::string checkpoint_error(F&& f) {
  try {
    f();
  } catch (const fulgur::CheckpointError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected a fulgur::CheckpointError, got another exception: " << e.what());
  }
  FAIL("expected a fulgur::CheckpointError, got none");
  return "";
}
}  // namespace checkpoint_tests
