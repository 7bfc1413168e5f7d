#pragma once
// What a fulgur::cli program is made of: its module's and data module's config types, its Settings,
// the schema of everything its command line accepts (seed_everything, trainer, model, data, ckpt_path)
// built from the compiled Trainer types and classes, and the callbacks a resolved config names.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "fulgur/cli/classes.hpp"
#include "fulgur/cli/described.hpp"
#include "fulgur/cli/resolve.hpp"
#include "fulgur/cli/values.hpp"
#include "fulgur/dispatch.hpp"
#include "fulgur/results.hpp"

namespace fulgur::cli {

/// No data module: the module gives its own loaders.
struct NoData {};
/// The hyper-parameters of a type that has none.
struct NoConfig {
  static constexpr auto fields() { return std::tuple<>(); }
};

template <class T>
struct config_type_of {
  using type = NoConfig;
};
template <class T>
  requires requires { typename T::config_type; }
struct config_type_of<T> {
  using type = typename T::config_type;
};
template <class T>
  requires(!requires { typename T::config_type; } && requires { typename T::ContainedType::config_type; })
struct config_type_of<T> {
  using type = typename T::ContainedType::config_type;
};

/// What a program says about itself.
struct Settings {
  std::string description{};  ///< printed by --help
  /// Save the resolved config as config.yaml in the log directory and in checkpoints' hyper_parameters.
  bool save_config = true;
  /// The program's own defaults, a YAML document applied over the fields' defaults before the environment
  /// and the command line (LightningCLI's default_config_files / trainer_defaults).
  std::string defaults{};
  /// {source, target}: the target key takes the source's value once the config is resolved
  /// (LightningCLI's link_arguments), e.g. {"model.context", "data.context"}; setting the target to
  /// another value is an error naming the source.
  std::vector<std::pair<std::string, std::string>> links{};
};

/// What run() did, for tests and benchmarks (main() turns it into an exit code).
struct Outcome {
  int exit_code = 0;
  std::string subcommand{};
  std::string combination{};  ///< "cpu/single_device/32-true"
  std::string resolved_config{};
  std::optional<FitResult> fit{};
  std::vector<EvaluationResult> evaluation{};
  std::int64_t predictions = 0;  ///< predict: batches predicted
};


namespace detail {

inline bool is_seed(const YAML::Node& node) {
  const auto integer = as_integer(node);
  return as_bool(node).has_value() || (integer && *integer >= 0 && *integer <= 0xffffffffLL);
}

template <class S>
ClassChoice strategy_choice() {
  ClassChoice choice{.name = std::string(S::name), .aliases = {}, .doc = {}, .init_args = {}};
  const std::string_view name = S::name;
  if (name == "single_device") choice.aliases = {"SingleDeviceStrategy", "lightning.pytorch.strategies.SingleDeviceStrategy"};
  if (name == "ddp") choice.aliases = {"DDPStrategy", "lightning.pytorch.strategies.DDPStrategy"};
  if (name == "fsdp") choice.aliases = {"deepspeed_stage_3", "FSDPStrategy", "lightning.pytorch.strategies.FSDPStrategy"};
  using Options = typename fulgur::detail::strategy_options<S>::type;
  if constexpr (described<Options>) choice.init_args = schema_of<Options>();
  return choice;
}

template <class... S>
std::vector<ClassChoice> strategy_choices(fulgur::detail::type_list<S...>) {
  std::vector<ClassChoice> choices{ClassChoice{.name = "auto", .aliases = {}, .doc = "ddp with several processes, else single_device", .init_args = {}}};
  (choices.push_back(strategy_choice<S>()), ...);
  return choices;
}

template <class... X>
std::string names_list(fulgur::detail::type_list<X...>) {
  std::string out;
  ((out += (out.empty() ? "" : ", ") + std::string(X::name)), ...);
  return out;
}

inline Schema value_key(std::string name, std::string type, YAML::Node default_value, std::string doc, ValueCheck check) {
  Schema s;
  s.name = std::move(name);
  s.kind = Schema::Kind::value;
  s.type = std::move(type);
  s.default_value = std::move(default_value);
  s.doc = std::move(doc);
  s.check = std::move(check);
  return s;
}

/// A check that the value is one of `names` (the compiled policies' names on `axis`, their aliases and 'auto'),
/// with the name probably meant (fulgur::dispatch's: "fp16" is '16-mixed'). An alias of a policy the program did
/// not compile (Lightning's "16" without '16-mixed') is said to be that.
inline ValueCheck one_of(std::vector<std::string> names, std::string_view axis,
                         std::vector<std::pair<std::string, std::string>> aliases = {}) {
  return [names = std::move(names), axis, aliases = std::move(aliases)](const YAML::Node& node) -> std::optional<std::string> {
    if (node.IsScalar() && !is_null(node) && std::find(names.begin(), names.end(), node.Scalar()) != names.end())
      return std::nullopt;
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "'" : ", '") + n + "'";
    for (const auto& [alias, target] : aliases)
      if (node.IsScalar() && node.Scalar() == alias)
        return "one of this program's " + list + "\n; '" + alias + "' is '" + target +
               "', which this program did not compile (the Trainer types it gives fulgur::cli::main decide)";
    if (node.IsScalar()) {
      const std::vector<std::string_view> views(names.begin(), names.end());
      if (const auto meant = fulgur::detail::probably_meant(axis, node.Scalar(), views); !meant.name.empty())
        list += "\n; did you mean '" + std::string(meant.name) + "'?" +
                (meant.aside.empty() ? "" : " " + std::string(meant.aside));
    }
    return "one of this program's " + list;
  };
}

template <class... X>
std::vector<std::string> names_with_aliases(fulgur::detail::type_list<X...> axis,
                                            std::initializer_list<std::pair<std::string_view, std::string_view>> aliases) {
  std::vector<std::string> names{std::string(X::name)...};
  for (const auto& [alias, target] : aliases)
    if (fulgur::detail::has_name(axis, target)) names.emplace_back(alias);
  names.emplace_back("auto");
  return names;
}

template <class C>
constexpr bool is_logger_class = logger<C>;

/// The whole config: seed_everything, trainer (TrainerConfig and the policy names, callbacks, logger),
/// model, data, ckpt_path.
template <class Module, class Data, class Trainers, class... C>
Schema root_schema(Trainers, class_list<C...>) {
  using Axes = fulgur::detail::axes_of<typename fulgur::detail::types_of<Trainers>::type>;
  std::vector<Schema> trainer;
  trainer.push_back(value_key("accelerator", "str", YAML::Node("auto"),
                              "compiled: " + names_list(typename Axes::accelerators{}) +
                                  fulgur::detail::aliases_of(typename Axes::accelerators{}, {{"gpu", "cuda"}}),
                              one_of(names_with_aliases(typename Axes::accelerators{}, {{"gpu", "cuda"}}), "accelerator",
                                     {{"gpu", "cuda"}})));
  Schema strategy;
  strategy.name = "strategy";
  strategy.kind = Schema::Kind::class_one;
  strategy.doc = "compiled: auto, " + names_list(typename Axes::strategies{}) + "; options as init_args";
  strategy.choices = strategy_choices(typename Axes::strategies{});
  strategy.unknown_hint = "fulgur's strategies (single_device, ddp, deepspeed_stage_1, deepspeed_stage_2, fsdp) join "
                          "by adding their Trainer types to the list the program gives fulgur::cli::main (the sharded "
                          "ones: fulgur::shipped_sharded_strategies)";
  strategy.default_value = YAML::Node(YAML::NodeType::Map);
  strategy.default_value["class_path"] = "auto";
  strategy.default_value["init_args"] = YAML::Node(YAML::NodeType::Map);
  trainer.push_back(std::move(strategy));
  trainer.push_back(value_key("precision", "str", YAML::Node("32-true"),
                              "compiled: " + names_list(typename Axes::precisions{}) +
                                  fulgur::detail::aliases_of(typename Axes::precisions{},
                                                             {{"32", "32-true"}, {"64", "64-true"}, {"16", "16-mixed"},
                                                              {"bf16", "bf16-mixed"}},
                                                             "32-true"),
                              one_of(names_with_aliases(typename Axes::precisions{},
                                                        {{"32", "32-true"}, {"64", "64-true"}, {"16", "16-mixed"},
                                                         {"bf16", "bf16-mixed"}}),
                                     "precision",
                                     {{"32", "32-true"}, {"64", "64-true"}, {"16", "16-mixed"}, {"bf16", "bf16-mixed"}})));
  for (Schema& key : schema_of<TrainerConfig>()) trainer.push_back(std::move(key));
  Schema callbacks, loggers;
  callbacks.name = "callbacks";
  callbacks.kind = Schema::Kind::class_list;
  callbacks.doc = "callbacks by class_path and init_args";
  callbacks.default_value = YAML::Node(YAML::NodeType::Sequence);
  loggers.name = "logger";
  loggers.kind = Schema::Kind::class_list;
  loggers.doc = "loggers by class_path and init_args; true: TensorBoardLogger; false: none";
  loggers.default_value = YAML::Node(YAML::NodeType::Sequence);
  loggers.takes_bool = true;
  ([&] {
    (is_logger_class<C> ? loggers : callbacks).choices.push_back(choice_of<C>());
  }(), ...);
  if (!loggers.choices.empty()) {
    callbacks.unknown_hint = "Loggers (";
    for (const auto& choice : loggers.choices) callbacks.unknown_hint += (choice.name == loggers.choices.front().name ? "" : ", ") + choice.name;
    callbacks.unknown_hint += ") go in trainer.logger";
  }
  for (const auto& choice : loggers.choices)
    if (choice.name == "TensorBoardLogger") {
      YAML::Node entry(YAML::NodeType::Map);
      entry["class_path"] = choice.name;
      entry["init_args"] = defaults_of(group("", "", choice.init_args));
      loggers.default_value.push_back(entry);
    }
  trainer.push_back(std::move(callbacks));
  trainer.push_back(std::move(loggers));
  const ValueCheck flag = [](const YAML::Node& node) -> std::optional<std::string> {
    if (as_bool(node)) return std::nullopt;
    return "bool";
  };
  trainer.push_back(value_key("enable_checkpointing", "bool", YAML::Node("true"),
                              "a ModelCheckpoint with its defaults when trainer.callbacks has none", flag));
  trainer.push_back(value_key("enable_model_summary", "bool", YAML::Node("true"),
                              "a ModelSummary when trainer.callbacks has none", flag));

  Schema root = group("", "", {});
  root.children.push_back(value_key(
      "seed_everything", "bool | int", YAML::Node("true"),
      "seed for torch's generators; true: draw one (the resolved config keeps it, so a rerun repeats the run); "
      "false: none",
      [](const YAML::Node& node) -> std::optional<std::string> {
        if (is_seed(node)) return std::nullopt;
        return "true, false or an integer in [0, 2^32)";
      }));
  root.children.push_back(group("trainer", "the Trainer", std::move(trainer)));
  root.children.push_back(group("model", "the module's hyper-parameters",
                                schema_of<typename config_type_of<Module>::type>()));
  if constexpr (!std::is_same_v<Data, NoData>)
    root.children.push_back(group("data", "the data module's settings", schema_of<typename config_type_of<Data>::type>()));
  Schema ckpt_path = value_key("ckpt_path", "str | null", YAML::Node(YAML::NodeType::Null),
                               "fit: continue this checkpoint exactly ('last': the newest last.ckpt); "
                               "validate/test/predict: its weights",
                               [](const YAML::Node& node) -> std::optional<std::string> {
                                 if (is_null(node) || node.IsScalar()) return std::nullopt;
                                 return "str | null";
                               });
  ckpt_path.text = Schema::Text::raw_or_null;
  root.children.push_back(std::move(ckpt_path));
  return root;
}

template <class T>
T make_with(const typename config_type_of<T>::type& config) {
  if constexpr (std::is_same_v<typename config_type_of<T>::type, NoConfig>) return T();
  else return T(config);
}

/// The callbacks and loggers the config names, one std::vector per compiled class. What cannot be made
/// (a wrong type, a value a constructor refuses) joins `problems`, each named by its place in the config.
template <class... C>
std::tuple<std::vector<C>...> make_classes(const YAML::Node& trainer, class_list<C...>, std::vector<std::string>& problems) {
  std::tuple<std::vector<C>...> out;
  bool has_checkpoint = false, has_summary = false;
  for (const char* slot : {"callbacks", "logger"})
    for (std::size_t i = 0; i < trainer[slot].size(); ++i) {
      const YAML::Node entry = trainer[slot][i];
      const std::string name = entry["class_path"].Scalar();
      const std::string where = "trainer." + std::string(slot) + "[" + std::to_string(i) + "]";
      ([&] {
        if (name != class_info<C>::name) return;
        using Args = typename class_info<C>::args_type;
        try {
          std::get<std::vector<C>>(out).push_back(class_info<C>::make(read_as<Args>(entry["init_args"], where + ".init_args")));
        } catch (const ConfigError& e) {
          problems.insert(problems.end(), e.problems.begin(), e.problems.end());
        } catch (const MisconfigurationError& e) {  // the class refusing a value, in its own words
          problems.push_back(where + " (" + name + "): " + e.what());
        }
        has_checkpoint = has_checkpoint || std::is_same_v<C, ModelCheckpoint>;
        has_summary = has_summary || std::is_same_v<C, ModelSummary>;
      }(), ...);
    }
  const bool checkpointing = *as_bool(trainer["enable_checkpointing"]);
  if (!checkpointing && has_checkpoint)
    problems.push_back("trainer.enable_checkpointing is false but trainer.callbacks has a ModelCheckpoint: set it to "
                       "true or remove the callback (Lightning refuses this too).");
  if constexpr ((std::is_same_v<C, ModelCheckpoint> || ...))
    if (checkpointing && !has_checkpoint) std::get<std::vector<ModelCheckpoint>>(out).emplace_back();
  if constexpr ((std::is_same_v<C, ModelSummary> || ...))
    if (*as_bool(trainer["enable_model_summary"]) && !has_summary) std::get<std::vector<ModelSummary>>(out).emplace_back();
  return out;
}


}  // namespace detail

}  // namespace fulgur::cli
