#pragma once
// fulgur::cli::main<Module, Data>(argc, argv): LightningCLI for a C++ program. Subcommands fit, validate,
// test, predict; --config FILE (repeatable) and dotted overrides; callbacks and loggers by class_path;
// --print_config and --help; the (accelerator, strategy, precision) triple chosen at run time among the
// Trainer types the program compiled (fulgur::dispatch). Nothing is built until the whole config is
// valid; the resolved config goes to the run's log directory (config.yaml), its checkpoints
// (hyper_parameters) and its loggers. docs/cli.md.
//
// Module: a training module whose hyper-parameters are a described struct `Module::config_type` (on the
// module, or on its Impl for a TORCH_MODULE holder), built as Module(config). Data (optional): the same,
// with train_dataloader(), and as needed val_dataloader(), test_dataloader(), predict_dataloader(),
// prepare_data(), setup(std::string_view stage) — Lightning's LightningDataModule. Without Data, the
// module gives the loaders.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fulgur/cli/program.hpp"
#include "fulgur/cli/resolve.hpp"
#include "fulgur/cli/save_config.hpp"
#include "fulgur/detail/files.hpp"
#include "fulgur/detail/host_terms.hpp"
#include "fulgur/detail/trainer_support.hpp"
#include "fulgur/dispatch.hpp"
#include "fulgur/fulgur.hpp"

namespace fulgur::cli {

namespace detail {

/// The seed: the config's integer, or one drawn for `true` (written into the config, so that the printed
/// and saved config repeat the run).
inline std::optional<std::uint64_t> settle_seed(Config& config) {
  const YAML::Node node = config.tree()["seed_everything"];
  if (const auto flag = as_bool(node)) {
    if (!*flag) return std::nullopt;
    const std::uint64_t seed = std::random_device{}();
    config.set("seed_everything", YAML::Node(std::to_string(seed)));
    return seed;
  }
  return static_cast<std::uint64_t>(*as_integer(node));
}

/// The variable through which the workers fulgur's launcher starts (by running this program again) get
/// the launching process's resolved config, rather than resolving their own: the same config on every
/// rank, even when a --config file was a pipe or changed since, and the same drawn seed.
inline constexpr const char* resolved_config_variable = "FULGUR_CLI_RESOLVED_CONFIG";

/// Set while the Trainer is built (when the launcher starts the workers), unset after.
class ResolvedConfigForWorkers {
 public:
  explicit ResolvedConfigForWorkers(const std::string& yaml) { ::setenv(resolved_config_variable, yaml.c_str(), 1); }
  ~ResolvedConfigForWorkers() { ::unsetenv(resolved_config_variable); }
  ResolvedConfigForWorkers(const ResolvedConfigForWorkers&) = delete;
  ResolvedConfigForWorkers& operator=(const ResolvedConfigForWorkers&) = delete;
};

template <class Trainer>
void print_metrics(Trainer& trainer, std::string_view stage, const std::vector<EvaluationResult>& results) {
  for (std::size_t i = 0; i < results.size(); ++i) {
    std::string line = std::string(stage) + (results.size() > 1 ? " (dataloader " + std::to_string(i) + ")" : "") + ":";
    for (const auto& [name, value] : results[i].metrics) {
      char text[64];
      std::snprintf(text, sizeof text, " %s=%.6g", name.c_str(), value);
      line += text;
    }
    trainer.print(line);
  }
}

/// Each link's target takes its source's value; a target the command line set otherwise is an error.
inline void apply_links(Config& config, const YAML::Node& before, const std::vector<std::pair<std::string, std::string>>& links) {
  auto at = [](YAML::Node node, const std::string& key) {
    std::size_t start = 0;
    for (std::size_t dot; (dot = key.find('.', start)) != std::string::npos; start = dot + 1)
      node.reset(node[key.substr(start, dot - start)]);
    return node[key.substr(start)];
  };
  std::vector<std::string> problems;
  for (const auto& [source, target] : links) {
    const YAML::Node value = at(YAML::Clone(config.tree()), source), given = at(YAML::Clone(config.tree()), target),
                     default_value = at(YAML::Clone(before), target);
    if (!value.IsDefined() || !given.IsDefined()) {
      problems.push_back("the link " + source + " -> " + target + " names a key this program does not have");
      continue;
    }
    if (YAML::Dump(given) != YAML::Dump(default_value) && YAML::Dump(given) != YAML::Dump(value))
      problems.push_back(target + " follows " + source + " (they are linked): set " + source + " instead");
    config.set(target, value);
  }
  if (!problems.empty()) throw ConfigError(problems);
}

/// The subcommands the module and data can run, and for the others what they lack.
template <class Module, class Data>
std::pair<std::vector<std::string>, std::vector<std::pair<std::string, std::string>>> available_subcommands() {
  using Impl = std::remove_cvref_t<decltype(fulgur::detail::referent(std::declval<Module&>()))>;
  using Source = std::conditional_t<std::is_same_v<Data, NoData>, Impl, Data>;
  const std::string owner = std::is_same_v<Data, NoData> ? "the module" : "the data module";
  std::vector<std::string> available{"fit"};
  std::vector<std::pair<std::string, std::string>> lacking;
  auto note = [&](const char* name, bool has_loader, bool has_step, const char* loader, const char* step) {
    if (has_loader && has_step) available.push_back(name);
    else if (!has_loader) lacking.emplace_back(name, owner + " has no " + loader + "()");
    else lacking.emplace_back(name, std::string("the module has no ") + step + " for its batches");
  };
  constexpr bool val = requires(Source& s) { s.val_dataloader(); };
  constexpr bool test = requires(Source& s) { s.test_dataloader(); };
  constexpr bool predict = requires(Source& s) { s.predict_dataloader(); };
  note("validate", val, [] {
    if constexpr (val) return has_validation_step<Impl, loops::batch_of_t<decltype(std::declval<Source&>().val_dataloader())>>;
    else return false;
  }(), "val_dataloader", "validation_step");
  note("test", test, [] {
    if constexpr (test) return has_test_step<Impl, loops::batch_of_t<decltype(std::declval<Source&>().test_dataloader())>>;
    else return false;
  }(), "test_dataloader", "test_step");
  note("predict", predict, [] {
    if constexpr (predict) return has_predict_step<Impl, loops::batch_of_t<decltype(std::declval<Source&>().predict_dataloader())>>;
    else return false;
  }(), "predict_dataloader", "predict_step");
  return {available, lacking};
}

/// An exception's text without LibTorch's C++ stack, which tells someone who gave a bad value nothing.
inline std::string text_of(const std::exception& e) {
  if (const auto* torch_error = dynamic_cast<const c10::Error*>(&e)) return torch_error->what_without_backtrace();
  return e.what();
}

/// `make()`, what the module or data module (`owner`) made from the config's `section` keys: a value it
/// refuses is a config error (exit 2) and anything else a failure (exit 1), each said to be that.
template <class Make>
auto made_from_keys(const char* owner, const char* section, const char* what, Make&& make) {
  try {
    return make();
  } catch (const ConfigError&) {
    throw;
  } catch (const MisconfigurationError& e) {
    throw ConfigError({std::string(owner) + "'s " + what + " refuses the config's " + section +
                       " keys (--print_config shows them): " + e.what()});
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string(owner) + "'s " + what + " failed on the config's " + section +
                             " keys (--print_config shows them): " + text_of(e));
  }
}

/// The module made from the config's model keys; its constructor's failure said to be that.
template <class Module>
Module make_module(const YAML::Node& keys) {
  using ModelConfig = typename config_type_of<Module>::type;
  ModelConfig config = read_as<ModelConfig>(keys, "model");  // a wrong type: the config error, as it is
  return made_from_keys("the module", "model", "constructor", [&] { return make_with<Module>(std::move(config)); });
}

template <class Module, class Data, class Trainer>
Outcome run_subcommand(Trainer& trainer, const CommandLine& command, const YAML::Node& tree, Outcome outcome) {
  Module module = make_module<Module>(tree["model"]);
  auto& impl = fulgur::detail::referent(module);
  std::string ckpt_path = is_null(tree["ckpt_path"]) ? std::string() : tree["ckpt_path"].Scalar();
  // A path as the shell gives it (relative to the working directory) when it names a file there; else as
  // the Trainer takes it ("last", "hpc", or under trainer.default_root_dir).
  if (!ckpt_path.empty() && ckpt_path.front() != '/' && fulgur::detail::path_exists(ckpt_path))
    ckpt_path = fulgur::detail::absolute_path(ckpt_path);
  // A loader the config's keys cannot make (a batch_size of 0, a file that is not there) is said to be that.
  const bool own_data = !std::is_same_v<Data, NoData>;
  auto loader_of = [&](const char* what, auto make) {
    return made_from_keys(own_data ? "the data module" : "the module", own_data ? "data" : "model", what, make);
  };
  auto run = [&](auto& source) {
    if (command.subcommand == "fit") {
      auto train = loader_of("train_dataloader()", [&] { return source.train_dataloader(); });
      if constexpr (requires { source.val_dataloader(); }) {
        auto val = loader_of("val_dataloader()", [&] { return source.val_dataloader(); });
        outcome.fit = trainer.fit(module, train, val, {.ckpt_path = ckpt_path});
      } else {
        outcome.fit = trainer.fit(module, train, {.ckpt_path = ckpt_path});
      }
      if (outcome.fit->interrupted) outcome.exit_code = 130;
      std::string line = "fit: " + outcome.fit->stop_reason + " at step " + std::to_string(outcome.fit->global_step) + ";";
      for (const auto& [name, value] : outcome.fit->metrics) {
        char text[96];
        std::snprintf(text, sizeof text, " %s=%.6g", name.c_str(), value);
        line += text;
      }
      trainer.print(line);
      return;
    }
    if (ckpt_path.empty())
      trainer.print("fulgur::cli: no ckpt_path: ", command.subcommand,
                    " runs on the module's initial weights (give --ckpt_path=PATH or last for a checkpoint's)");
    // Lightning's validate/test/predict(ckpt_path=...): the checkpoint's weights, found and loaded by the
    // Trainer ("best" is the best of a fit in the same process, which a command line never has).
    const EvaluationOptions options{.ckpt_path = ckpt_path};
    auto missing = [&](const std::string& what, const char* owner) {
      throw ConfigError({command.subcommand + " needs " + what + " on the " + owner + "."});
    };
    const char* data_owner = std::is_same_v<Data, NoData> ? "module" : "data module";
    using Impl = std::remove_cvref_t<decltype(impl)>;
    // Each subcommand is compiled only where the module and the data can run it: a module without
    // test_step is a program without `test` (it says so when asked), not a compile error.
    if (command.subcommand == "validate") {
      if constexpr (requires { source.val_dataloader(); }) {
        if constexpr (has_validation_step<Impl, loops::batch_of_t<decltype(source.val_dataloader())>>) {
          auto loader = loader_of("val_dataloader()", [&] { return source.val_dataloader(); });
          outcome.evaluation = {trainer.validate(module, loader, options)};
        } else {
          missing("validation_step(batch, batch_idx)", "module");
        }
      } else {
        missing("val_dataloader()", data_owner);
      }
    } else if (command.subcommand == "test") {
      if constexpr (requires { source.test_dataloader(); }) {
        if constexpr (has_test_step<Impl, loops::batch_of_t<decltype(source.test_dataloader())>>) {
          auto loader = loader_of("test_dataloader()", [&] { return source.test_dataloader(); });
          outcome.evaluation = {trainer.test(module, loader, options)};
        } else {
          missing("test_step(batch, batch_idx)", "module");
        }
      } else {
        missing("test_dataloader()", data_owner);
      }
    } else if (command.subcommand == "predict") {
      if constexpr (requires { source.predict_dataloader(); }) {
        if constexpr (has_predict_step<Impl, loops::batch_of_t<decltype(source.predict_dataloader())>>) {
          auto loader = loader_of("predict_dataloader()", [&] { return source.predict_dataloader(); });
          const auto predictions = trainer.predict(module, loader, options);
          if constexpr (requires { predictions.size(); })
            outcome.predictions = static_cast<std::int64_t>(predictions.size());
          trainer.print("predict: ", outcome.predictions, " batches predicted");
        } else {
          missing("predict_step(batch, batch_idx)", "module");
        }
      } else {
        missing("predict_dataloader()", data_owner);
      }
    }
    print_metrics(trainer, command.subcommand, outcome.evaluation);
  };
  if constexpr (std::is_same_v<Data, NoData>) {
    run(impl);
  } else {
    using DataConfig = typename config_type_of<Data>::type;
    DataConfig data_config = read_as<DataConfig>(tree["data"], "data");
    Data data = made_from_keys("the data module", "data", "constructor", [&] { return make_with<Data>(std::move(data_config)); });
    if constexpr (requires { data.prepare_data(); })
      if (trainer.local_rank() == 0) data.prepare_data();
    if constexpr (requires { data.setup(std::string_view()); }) data.setup(command.subcommand);
    run(data);
  }
  return outcome;
}

template <class Module, class Data, class Combination, class... C>
Outcome run_with(const CommandLine& command, const YAML::Node& tree, TrainerConfig trainer_config,
                 class_list<C...> classes, const Settings& settings, Outcome outcome) {
  using Options = typename Combination::options_type;
  Options options{};
  if constexpr (described<Options>) read_into(tree["trainer"]["strategy"]["init_args"], options, "trainer.strategy.init_args");
  // One run names every value that cannot work: the Trainer's settings and each callback's and logger's.
  std::vector<std::string> problems;
  try {
    fulgur::detail::validate_config(trainer_config);
  } catch (const MisconfigurationError& e) {
    problems.push_back("the Trainer refuses this config: " + std::string(e.what()));
  }
  auto vectors = make_classes(tree["trainer"], classes, problems);
  if (!problems.empty()) throw ConfigError(problems);
  const Hyperparameters model_keys = flatten(tree["model"]);
  SaveConfig save(outcome.resolved_config, flatten(tree), model_keys, settings.save_config);
  using Trainer = typename Combination::template with_callbacks<SaveConfig, std::vector<C>...>;
  return std::apply(
      [&](auto&... vector) {
        std::optional<ResolvedConfigForWorkers> for_workers(std::in_place, outcome.resolved_config);
        std::optional<Trainer> built;
        try {
          built.emplace(std::move(trainer_config), std::move(options), std::move(save), std::move(vector)...);
        } catch (const MisconfigurationError& e) {
          throw ConfigError({"the Trainer refuses this config: " + std::string(e.what())});
        }
        for_workers.reset();
        Trainer& trainer = *built;
        outcome.combination = trainer.combination_name();
        return run_subcommand<Module, Data>(trainer, command, tree, std::move(outcome));
      },
      vectors);
}

}  // namespace detail

/// Parses, checks and runs; throws ConfigError for a command line or config that cannot run.
template <class Module, class Data = NoData, class Trainers = std::remove_const_t<decltype(shipped_trainers)>,
          class Classes = shipped_classes>
Outcome run(const std::vector<std::string>& args, Trainers trainers = shipped_trainers, Classes classes = {},
            const Settings& settings = {}) {
  static const std::vector<std::string> subcommands{"fit", "validate", "test", "predict"};
  // The library's hints name settings as this program's user sets them: trainer.max_epochs, --ckpt_path.
  const fulgur::detail::ReaderScope reader(fulgur::detail::Reader::command_line);
  const auto [available, lacking] = detail::available_subcommands<Module, Data>();
  const CommandLine command = parse_command_line(args, subcommands, available);
  if (!command.subcommand.empty())
    for (const auto& [name, why] : lacking)
      if (name == command.subcommand)
        throw ConfigError({"this program has no `" + name + "`: " + why + ". It runs " + [&] {
                             std::string list;
                             for (const auto& a : available) list += (list.empty() ? "" : ", ") + a;
                             return list;
                           }() + "."});
  const Schema root = detail::root_schema<Module, Data>(trainers, classes);
  Outcome outcome{.subcommand = command.subcommand};
  if (command.help) {  // with the defaults this program and the files given would give
    Config shown(root);
    if (!settings.defaults.empty()) shown.apply({Source::Kind::text, command.program + "'s defaults", settings.defaults});
    for (const auto& source : command.sources) shown.apply(source);
    shown.throw_if_problems();  // a file that cannot be read is said, not left out of the defaults shown (probe)
    std::cout << help_text(root, command, available, settings.description, shown.tree());
    return outcome;
  }
  Config config(root);
  if (const char* launched = std::getenv(detail::resolved_config_variable)) {
    // A worker started by fulgur's launcher: the launching process's config, as it resolved it.
    config.apply({Source::Kind::text, "the launching process's resolved config", launched});
    config.throw_if_problems();
  } else {
    if (!settings.defaults.empty()) config.apply({Source::Kind::text, command.program + "'s defaults", settings.defaults});
    config.throw_if_problems();  // the program's own defaults: its author's mistake, said alone
    const YAML::Node before = YAML::Clone(config.tree());
    if (!command.env_prefix.empty()) config.read_environment(command.env_prefix);
    for (const auto& source : command.sources) config.apply(source);
    config.throw_if_problems();
    detail::apply_links(config, before, settings.links);
  }
  const std::optional<std::uint64_t> seed = detail::settle_seed(config);
  outcome.resolved_config = to_yaml_text(config.tree());
  if (command.print_config) {
    std::cout << outcome.resolved_config << std::flush;
    return outcome;
  }
  const YAML::Node& tree = config.tree();
  TrainerConfig trainer_config = read_as<TrainerConfig>(tree["trainer"], "trainer");
  trainer_config.seed = seed;
  check_ckpt_path(tree["ckpt_path"], trainer_config);
  const YAML::Node trainer = tree["trainer"];
  return dispatch(
      trainer["accelerator"].Scalar(), trainer["strategy"]["class_path"].Scalar(), trainer["precision"].Scalar(),
      [&](auto combination) {
        using Combination = typename decltype(combination)::type;
        return detail::run_with<Module, Data, Combination>(command, tree, trainer_config, classes, settings, outcome);
      },
      trainers, trainer_config);
}

/// A program's main: run(), with a config error (exit 2) or a failure (exit 1) printed to stderr.
template <class Module, class Data = NoData, class Trainers = std::remove_const_t<decltype(shipped_trainers)>,
          class Classes = shipped_classes>
int main(int argc, char** argv, Trainers trainers = shipped_trainers, Classes classes = {}, const Settings& settings = {}) {
  const std::vector<std::string> args(argv, argv + argc);
  try {
    return run<Module, Data>(args, trainers, classes, settings).exit_code;
  } catch (const MisconfigurationError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << (args.empty() ? std::string("fulgur") : args.front().substr(args.front().rfind('/') + 1)) << ": "
              << detail::text_of(e) << "\n";
    return 1;
  }
}

}  // namespace fulgur::cli
