#pragma once
// Where a logger writes: <save_dir>/<name>/version_<n>, as Lightning lays logs out (the next free
// version unless one is given). Torch-free.
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "fulgur/loggers/hyperparameters.hpp"

namespace fulgur {

struct LoggerOptions {
  std::string save_dir{};                ///< empty: TrainerConfig::default_root_dir
  std::string name = "lightning_logs";   ///< empty: logs go straight into save_dir/version_<n>
  /// A number (version_<n>) or a directory name; unset: one more than the highest version_<n> there.
  std::optional<std::variant<std::int64_t, std::string>> version{};
  std::string prefix{};                  ///< put before every metric name, with '-'
};

/// Where loggers write, given to each logger's set_up before anything is written.
struct LoggerSetup {
  std::string root_dir;  ///< TrainerConfig::default_root_dir
  int global_rank = 0;   ///< only global rank 0 writes
};

namespace loggers::detail {

/// The directory of a logger, resolved once (before any logger of the run creates its own, so
/// that loggers sharing a name also share the version).
class LogDirectory {
 public:
  explicit LogDirectory(LoggerOptions options) : options_(std::move(options)) {}
  void resolve(const std::string& default_root_dir);
  /// A resumed run writes on in the version the checkpoint's run wrote to, unless the options name
  /// one or the directory is resolved already (this logger wrote in this process before).
  bool resume(const std::string& version);
  bool resolved() const { return !path_.empty(); }
  /// save_dir/name/version_<n> (empty before resolve).
  const std::string& path() const { return path_; }
  std::string version_name() const;
  /// The checkpoints folder of every version that exists under save_dir/name (a ModelCheckpoint
  /// without a dirpath writes in the run's version), absolute.
  std::vector<std::string> checkpoint_folders(const std::string& default_root_dir) const;
  const LoggerOptions& options() const { return options_; }

 private:
  LoggerOptions options_;
  std::string path_;
  std::string version_;
};

/// Adds `more` to `into` as a Python dict update does: a repeated name keeps its place, takes the new value.
void merge_hyperparameters(Hyperparameters& into, const Hyperparameters& more);
/// hparams.yaml as Lightning writes it (one `name: value` per line).
void write_hparams_yaml(const std::string& path, const Hyperparameters& hparams);
/// A value as Python prints it in a CSV or YAML file ("0.1", "32", "true"/"True" is the caller's).
std::string number_text(double value);

}  // namespace loggers::detail
}  // namespace fulgur
