#pragma once
// What a CLI program accepts, as data: the tree of keys (trainer / model / data / ...), each value's
// type, default and doc, and the class slots (trainer.callbacks, trainer.logger, trainer.strategy) with
// the classes the program compiled. Built from the field lists (cli/values.hpp) and read by the
// non-template parts in libfulgur_cli (cli/resolve.hpp): parsing, merging, checking, --help, printing.
#include <yaml-cpp/yaml.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fulgur::cli {

/// Checks one YAML value: nullopt when it is one, else what was expected; a word after a '\n' in it is said
/// after the value given ("; did you mean '16-mixed'?").
using ValueCheck = std::function<std::optional<std::string>(const YAML::Node&)>;

struct ClassChoice;

/// One key of the config: a value, a group of keys, or a slot holding classes by name.
struct Schema {
  enum class Kind {
    value,       ///< a scalar, list or map checked by `check`
    group,       ///< named children, in order
    class_one,   ///< a class name, or {class_path, init_args} (trainer.strategy)
    class_list,  ///< a list of them (trainer.callbacks, trainer.logger)
  };
  // Built by construction and push_back only: a YAML::Node assigned over another writes through to the
  // node it referred to (yaml-cpp's reference semantics), so a Schema is never assigned, and a vector
  // of them never shifts (no insert in the middle).
  Schema() = default;
  Schema(const Schema&) = default;
  Schema(Schema&&) = default;
  Schema& operator=(const Schema&) = delete;
  Schema& operator=(Schema&&) = delete;

  std::string name;
  Kind kind = Kind::group;
  std::string doc;
  std::string type;            ///< value: "int | null", for --help and errors
  ValueCheck check;            ///< value
  /// value: the value as its type writes it back (1e-3 -> 0.001, a string quoted where it looks like
  /// something else), so that the printed config reads the same in any YAML reader; null: kept as given.
  std::function<YAML::Node(const YAML::Node&)> normalize;
  /// value: a command-line value is this key's text as written, not parsed as YAML (a str key:
  /// --trainer.callbacks.filename={epoch}-{val_loss:.2f}); `nullable`: except null / ~.
  enum class Text { yaml, raw, raw_or_null } text = Text::yaml;
  YAML::Node default_value;    ///< value and class slots
  std::vector<Schema> children;        ///< group
  std::vector<ClassChoice> choices;    ///< class slots
  /// class_list: also takes true (the default classes, `default_value`) and false (none) — trainer.logger.
  bool takes_bool = false;
  /// class slots: said after the classes it takes when a config names another (e.g. how to compile more in).
  std::string unknown_hint;

  const Schema* child(std::string_view key) const;
  Schema* child(std::string_view key);
};

/// A class a slot can hold: its name (and other names accepted for it, e.g. Lightning's class path) and
/// its init_args, which are keys like any other.
struct ClassChoice {
  std::string name;
  std::vector<std::string> aliases;
  std::string doc;
  std::vector<Schema> init_args;
  bool matches(std::string_view given) const;
};

inline Schema group(std::string name, std::string doc, std::vector<Schema> children) {
  Schema s;
  s.name = std::move(name);
  s.kind = Schema::Kind::group;
  s.doc = std::move(doc);
  s.children = std::move(children);
  return s;
}

}  // namespace fulgur::cli
