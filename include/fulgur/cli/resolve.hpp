#pragma once
// The non-template half of fulgur::cli (libfulgur_cli, torch-free): the command line read into an
// ordered list of sources, the config built from defaults, environment, YAML files and dotted
// overrides against a Schema — every error collected, each naming where it came from — and the
// resolved config printed back as YAML, as --help, and as loggers' hyper-parameters.
#include <yaml-cpp/yaml.h>

#include <string>
#include <string_view>
#include <vector>

#include "fulgur/cli/schema.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/loggers/hyperparameters.hpp"

namespace fulgur {
struct TrainerConfig;  // fulgur/trainer_config.hpp
}  // namespace fulgur

namespace fulgur::cli {

/// A command line or config that cannot run: every problem found, one per line.
struct ConfigError : MisconfigurationError {
  explicit ConfigError(std::vector<std::string> problems);
  std::vector<std::string> problems;
};

/// One thing to apply to the config, in command-line order.
struct Source {
  enum class Kind { file, set, append, text };
  Kind kind = Kind::set;
  std::string key;   ///< set / append: the dotted key ("trainer.max_epochs"); text: what to call it in errors
  std::string text;  ///< file: its path; set / append: the value as written (parsed as YAML); text: a YAML document
  std::string origin{};  ///< set: where it came from, for errors (empty: the command line's --key=value)
};

struct CommandLine {
  std::string program;     ///< argv[0]'s file name
  std::string subcommand;  ///< "fit", ... (empty: none given)
  std::vector<Source> sources;
  bool help = false;
  bool print_config = false;
  std::string env_prefix;  ///< empty: the environment is not read
};

/// Reads `prog SUBCOMMAND [--config FILE] [--key=value | --key value | --key+=value]... [--print_config]
/// [--help] [--env_prefix=P]`. `--help` before the subcommand is accepted too. An unknown subcommand is
/// told the ones in `offered` (those this program runs; empty: all of `subcommands`).
CommandLine parse_command_line(const std::vector<std::string>& args, const std::vector<std::string>& subcommands,
                               const std::vector<std::string>& offered = {});

/// The config under construction: starts from the schema's defaults; each apply() merges one source
/// (a file's mapping merges key by key, a list is replaced, a class slot keeps its init_args while its
/// class stays the same). Problems are collected, not thrown, so that one run reports them all.
class Config {
 public:
  explicit Config(const Schema& root);
  explicit Config(const Schema&& root) = delete;  // it keeps the schema by reference: a temporary would dangle
  /// PREFIX_TRAINER__MAX_EPOCHS=10 for every value key outside class slots (jsonargparse's names).
  void read_environment(const std::string& prefix);
  void apply(const Source& source);
  /// Sets a value key directly (e.g. seed_everything once it is drawn).
  void set(const std::string& key, const YAML::Node& value);

  const std::vector<std::string>& problems() const { return problems_; }
  void throw_if_problems() const;
  const YAML::Node& tree() const { return tree_; }
  const Schema& schema() const { return *root_; }

 private:
  void apply_node(YAML::Node parent, const std::string& key, const Schema& schema, const YAML::Node& given,
                  const std::string& path, const std::string& where, bool append);
  void apply_dotted(const std::string& key, const std::string& text, const std::string& where, bool append);
  void problem(const std::string& where, const std::string& text);

  const Schema* root_;
  YAML::Node tree_;
  std::vector<std::string> problems_;
};

/// The schema's defaults as a tree.
YAML::Node defaults_of(const Schema& schema);
/// The resolved config as YAML text: block style, keys in schema order, strings quoted where a reader
/// would take them for something else. Feeding it back with --config gives the same config.
std::string to_yaml_text(const YAML::Node& tree);

/// A ckpt_path that names a file (not "last", "best" or "hpc") where there is none, neither as given
/// nor under default_root_dir, as the Trainer would look: a ConfigError before anything is built, where
/// the Trainer would find it only after the data's preparation (Lightning's order), which may take minutes.
void check_ckpt_path(const YAML::Node& ckpt_path, const TrainerConfig& trainer);
/// `prog SUBCOMMAND --help`: every key with its type, default and doc, grouped as the schema is. The
/// defaults shown are `resolved`'s where it has the key (the program's own defaults and the --config
/// files given), else the fields'.
std::string help_text(const Schema& root, const CommandLine& command, const std::vector<std::string>& subcommands,
                      std::string_view description, const YAML::Node& resolved = YAML::Node());
/// The keys the loggers record: dotted names, each value a number, flag or text (lists as flow YAML).
Hyperparameters flatten(const YAML::Node& tree);
/// The candidate closest to `given` by edit distance, if close enough to be a likely typo; else "".
std::string closest(std::string_view given, const std::vector<std::string>& candidates);
/// Every dotted key under `schema` ("trainer.max_epochs", ...), class init_args excluded.
std::vector<std::string> dotted_keys(const Schema& schema, const std::string& prefix = "");

/// Scalars as the values' readers take them.
bool is_null(const YAML::Node& node);
std::optional<bool> as_bool(const YAML::Node& node);
std::optional<long long> as_integer(const YAML::Node& node);
std::optional<double> as_number(const YAML::Node& node);  ///< an integer or floating-point scalar
/// A double as YAML text that reads back to the same double: shortest round-trip form, always with a
/// '.' or exponent (1.0, 0.0003, 1e+20, .inf, .nan).
std::string number_text(double value);
/// A scalar that is a string whatever it looks like ("2", "true", ""): printed quoted where needed.
YAML::Node string_node(const std::string& text);

}  // namespace fulgur::cli
