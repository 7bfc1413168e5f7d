#pragma once
// A hint names a setting the way its reader sets it. The author of a C++ program sets
// TrainerConfig::max_epochs and FitOptions{.ckpt_path}; the user of a fulgur::cli program types
// --trainer.max_epochs and --ckpt_path, and cannot act on the C++ spelling. cli::run says which
// reader the process has; every message that names a setting asks these functions. Torch-free.
#include <string>
#include <string_view>

namespace fulgur::detail {

enum class Reader : unsigned char { cpp_program, command_line };

/// The process's reader: cpp_program unless a ReaderScope says otherwise.
Reader reader() noexcept;

/// Sets the reader for its lifetime (cli::run, around everything it builds and runs), then restores it.
class ReaderScope {
 public:
  explicit ReaderScope(Reader reader) noexcept;
  ~ReaderScope();
  ReaderScope(const ReaderScope&) = delete;
  ReaderScope& operator=(const ReaderScope&) = delete;

 private:
  Reader previous_;
};

/// Either text, as the reader has it: for a hint no function below spells.
std::string spelled(std::string_view in_cpp, std::string_view on_command_line);
/// TrainerConfig::gradient_clip_val / trainer.gradient_clip_val (nested keys with '.': preemption.enabled).
std::string trainer_setting(std::string_view key);
/// A Trainer setting given a value, in each reader's spelling of the value:
/// TrainerConfig::finite_loss_check = FiniteLossCheck::every_step / --trainer.finite_loss_check=every_step.
std::string trainer_setting(std::string_view key, std::string_view cpp_value, std::string_view command_line_value);
/// TrainerConfig / the trainer section: what a list of the Trainer's problems is about.
std::string trainer_settings_name();
/// A value left unset: std::nullopt / null.
std::string unset_value();
/// How to continue a fit from `path` (or "last", "hpc"):
/// FitOptions{.ckpt_path = "path"} / --ckpt_path=path.
std::string resume_setting(std::string_view path);
/// A DDP-family strategy's option set to `value`: DDPOptions::key = value (Trainer(config, {.key = value})) /
/// --trainer.strategy.key=value. `options_type` names the C++ struct (DDPOptions).
std::string strategy_setting(std::string_view options_type, std::string_view key, std::string_view value);

}  // namespace fulgur::detail
