// The worker's error file for torchrun (torchrun_error_file.hpp).
#include "src/distributed/torchrun_error_file.hpp"

#include <c10/util/Type.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <typeinfo>

namespace fulgur::distributed::detail {

namespace {

std::string json_string(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
      out += escaped;
    } else {
      out += c;  // UTF-8 passes through: JSON is UTF-8
    }
  }
  return out;
}

std::terminate_handler previous_handler = nullptr;

[[noreturn]] void report_then_terminate() {
  if (const std::exception_ptr current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const std::exception& e) {
      write_torchrun_error_file("uncaught " + c10::demangle(typeid(e).name()) + ": " + e.what(), /*replace=*/false);
    } catch (...) {
      write_torchrun_error_file("uncaught exception of a type not derived from std::exception", /*replace=*/false);
    }
  }
  if (previous_handler != nullptr) previous_handler();
  std::abort();
}

}  // namespace

void write_torchrun_error_file(const std::string& message, bool replace) {
  const char* file = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (file == nullptr || *file == '\0') return;
  if (!replace)
    if (std::FILE* existing = std::fopen(file, "r")) {
      std::fclose(existing);
      return;
    }
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string json =
      "{\"message\": \"" + json_string(message) + "\", \"timestamp\": " + std::to_string(seconds) + "}\n";
  if (std::FILE* out = std::fopen(file, "w")) {
    std::fputs(json.c_str(), out);
    std::fclose(out);
  }
}

void report_uncaught_exceptions_to_torchrun() {
  const char* file = std::getenv("TORCHELASTIC_ERROR_FILE");
  if (file == nullptr || *file == '\0') return;
  static std::once_flag installed;
  std::call_once(installed, [] { previous_handler = std::set_terminate(report_then_terminate); });
}

}  // namespace fulgur::distributed::detail
