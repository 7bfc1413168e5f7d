#include "fulgur/detail/host_terms.hpp"

#include <atomic>
#include <initializer_list>

namespace fulgur::detail {
namespace {

std::atomic<Reader> current{Reader::cpp_program};

bool read_on_command_line() noexcept { return current.load(std::memory_order_relaxed) == Reader::command_line; }

std::string joined(std::initializer_list<std::string_view> parts) {
  std::string text;
  for (std::string_view part : parts) text += part;
  return text;
}

}  // namespace

Reader reader() noexcept { return current.load(std::memory_order_relaxed); }

ReaderScope::ReaderScope(Reader reader) noexcept : previous_(current.exchange(reader, std::memory_order_relaxed)) {}
ReaderScope::~ReaderScope() { current.store(previous_, std::memory_order_relaxed); }

std::string spelled(std::string_view in_cpp, std::string_view on_command_line) {
  return std::string(read_on_command_line() ? on_command_line : in_cpp);
}

std::string trainer_setting(std::string_view key) {
  return joined({read_on_command_line() ? "trainer." : "TrainerConfig::", key});
}

std::string trainer_setting(std::string_view key, std::string_view cpp_value, std::string_view command_line_value) {
  return read_on_command_line() ? joined({"--trainer.", key, "=", command_line_value})
                           : joined({"TrainerConfig::", key, " = ", cpp_value});
}

std::string trainer_settings_name() { return read_on_command_line() ? "the trainer section" : "TrainerConfig"; }

std::string unset_value() { return read_on_command_line() ? "null" : "std::nullopt"; }

std::string resume_setting(std::string_view path) {
  return read_on_command_line() ? joined({"--ckpt_path=", path}) : joined({"FitOptions{.ckpt_path = \"", path, "\"}"});
}

std::string strategy_setting(std::string_view options_type, std::string_view key, std::string_view value) {
  if (read_on_command_line()) return joined({"--trainer.strategy.", key, "=", value});
  return joined({options_type, "::", key, " = ", value, " (Trainer(config, {.", key, " = ", value, "}))"});
}

}  // namespace fulgur::detail
