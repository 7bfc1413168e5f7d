// fulgur::cli's output: the resolved config as YAML, --help, and the loggers' flat hyper-parameters.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "fulgur/cli/resolve.hpp"

namespace fulgur::cli {

namespace {

bool looks_like_other_type(const YAML::Node& node) {
  return is_null(YAML::Node(node.Scalar())) || as_bool(YAML::Node(node.Scalar())) ||
         as_number(YAML::Node(node.Scalar()));
}

bool needs_quotes(const YAML::Node& node) {
  const std::string& s = node.Scalar();
  if (s.empty()) return true;
  if (node.Tag() == "!" && looks_like_other_type(node)) return true;
  if (s.front() == ' ' || s.back() == ' ' || s.back() == ':') return true;
  if (s.find(": ") != std::string::npos || s.find(" #") != std::string::npos) return true;
  // Control characters, and YAML 1.1's line breaks NEL, LS and PS: escaped (a plain scalar would break).
  if (std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7F; }) ||
      s.find("\xC2\x85") != std::string::npos || s.find("\xE2\x80\xA8") != std::string::npos ||
      s.find("\xE2\x80\xA9") != std::string::npos)
    return true;
  static constexpr std::string_view special = "-?:,[]{}#&*!|>'\"%@`";
  return special.find(s.front()) != std::string_view::npos && !as_number(YAML::Node(s));
}

std::string scalar_text(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "null";
  if (!needs_quotes(node)) return node.Scalar();
  std::string out = "\"";
  const std::string& s = node.Scalar();
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const auto at = [&](std::string_view bytes) { return s.compare(i, bytes.size(), bytes) == 0; };
    if (c == '"' || c == '\\') {
      out += '\\', out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02X", static_cast<unsigned>(c));
      out += escaped;
    } else if (at("\xC2\x85") || at("\xE2\x80\xA8") || at("\xE2\x80\xA9")) {  // NEL, LS, PS
      out += c == '\xC2' ? "\\u0085" : s[i + 2] == '\xA8' ? "\\u2028" : "\\u2029";  // yaml-cpp reads \\N as 0x85
      i += c == '\xC2' ? 1 : 2;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

/// {class_path: X, init_args: {}}: written as X.
bool bare_class(const YAML::Node& node) {
  return node.IsMap() && node.size() == 2 && node["class_path"] && node["init_args"] && node["init_args"].IsMap() &&
         node["init_args"].size() == 0;
}

void emit_value(std::string& out, const YAML::Node& value, int indent);

void emit_map(std::string& out, const YAML::Node& map, int indent, const std::string& first_prefix) {
  bool first = true;
  for (const auto& entry : map) {
    out += first ? first_prefix : std::string(static_cast<std::size_t>(indent), ' ');
    first = false;
    out += scalar_text(entry.first) + ":";
    emit_value(out, entry.second, indent);
  }
}

void emit_sequence(std::string& out, const YAML::Node& seq, int indent) {
  for (const auto& item : seq) {
    const std::string dash = std::string(static_cast<std::size_t>(indent), ' ') + "- ";
    if (item.IsMap() && item.size() > 0 && !bare_class(item)) {
      emit_map(out, item, indent + 2, dash);
    } else if (bare_class(item)) {
      out += dash + scalar_text(item["class_path"]) + "\n";
    } else if (item.IsMap() || item.IsSequence()) {
      out += dash + (item.IsMap() ? "{}" : "[]") + "\n";
    } else {
      out += dash + scalar_text(item) + "\n";
    }
  }
}

/// After "key:": the value on the same line, or indented below.
void emit_value(std::string& out, const YAML::Node& value, int indent) {
  if (bare_class(value)) {
    out += " " + scalar_text(value["class_path"]) + "\n";
  } else if (value.IsMap()) {
    if (value.size() == 0) {
      out += " {}\n";
    } else {
      out += "\n";
      emit_map(out, value, indent + 2, std::string(static_cast<std::size_t>(indent + 2), ' '));
    }
  } else if (value.IsSequence()) {
    if (value.size() == 0) {
      out += " []\n";
    } else {
      out += "\n";
      emit_sequence(out, value, indent);
    }
  } else {
    out += " " + scalar_text(value) + "\n";
  }
}

std::string flow(const YAML::Node& node) {
  YAML::Emitter emitter;
  emitter << YAML::Flow << node;
  return emitter.c_str();
}

void flatten_into(Hyperparameters& out, const YAML::Node& node, const std::string& key) {
  if (node.IsMap() && !node["class_path"]) {
    for (const auto& entry : node)
      flatten_into(out, entry.second, key.empty() ? entry.first.Scalar() : key + "." + entry.first.Scalar());
    return;
  }
  if (bare_class(node)) {
    out.emplace_back(key, node["class_path"].Scalar());
  } else if (node.IsMap() || node.IsSequence()) {
    out.emplace_back(key, flow(node));
  } else if (is_null(node)) {
    return;  // loggers' hyper-parameters have no null (config.yaml keeps the key)
  } else if (node.Tag() == "!") {
    out.emplace_back(key, node.Scalar());
  } else if (const auto flag = as_bool(node)) {
    out.emplace_back(key, *flag);
  } else if (const auto integer = as_integer(node)) {
    out.emplace_back(key, static_cast<std::int64_t>(*integer));
  } else if (const auto number = as_number(node)) {
    out.emplace_back(key, *number);
  } else {
    out.emplace_back(key, node.Scalar());
  }
}

/// The value a key takes if the command line leaves it: `current` (the program's defaults and the
/// files given so far) when there is one, else the field's own default.
std::string default_text(const Schema& s, const YAML::Node& current = YAML::Node()) {
  const YAML::Node value = current.IsDefined() && !current.IsNull() ? current : s.default_value;
  if (s.kind == Schema::Kind::class_list) {
    if (!value.IsSequence() || value.size() == 0) return "[]";
    std::string names;
    for (const auto& e : value) names += (names.empty() ? "" : ", ") + e["class_path"].Scalar();
    return "[" + names + "]";
  }
  if (s.kind == Schema::Kind::class_one) return value.IsMap() ? value["class_path"].Scalar() : scalar_text(value);
  if (current.IsDefined() && current.IsNull()) return "null";
  if (value.IsSequence() || value.IsMap()) return flow(value);
  return scalar_text(value);
}

void wrap(std::ostringstream& out, const std::string& text, std::size_t indent) {
  std::istringstream words(text);
  std::string word;
  std::size_t column = indent;
  out << std::string(indent, ' ');
  while (words >> word) {
    if (column > indent && column + 1 + word.size() > 100) {
      out << "\n" << std::string(indent, ' ');
      column = indent;
    }
    if (column > indent) out << ' ', ++column;
    out << word;
    column += word.size();
  }
  out << "\n";
}

void help_for(std::ostringstream& out, const Schema& s, const std::string& key, std::size_t indent,
              const YAML::Node& current) {
  if (s.kind == Schema::Kind::group) {
    for (const auto& c : s.children)
      help_for(out, c, key + "." + c.name, indent, current.IsMap() ? current[c.name] : YAML::Node());
    return;
  }
  std::string type = s.type;
  if (s.kind == Schema::Kind::class_one) type = "NAME or {class_path, init_args}";
  if (s.kind == Schema::Kind::class_list)
    type = std::string("list of {class_path, init_args}") + (s.takes_bool ? " | bool" : "");
  out << std::string(indent, ' ') << "--" << key << "  " << type << " (default: " << default_text(s, current) << ")\n";
  if (!s.doc.empty()) wrap(out, s.doc, indent + 6);
  for (const auto& choice : s.choices) {
    std::string args;
    for (const auto& a : choice.init_args) {
      args += (args.empty() ? "" : ", ") + a.name;
      if (a.kind == Schema::Kind::value) args += " (" + a.type + ", " + default_text(a) + ")";
    }
    wrap(out, choice.name + (choice.doc.empty() ? "" : ": " + choice.doc) +
                  (args.empty() ? "" : ". init_args: " + args),
         indent + 8);
  }
}

}  // namespace

std::string to_yaml_text(const YAML::Node& tree) {
  std::string out;
  emit_map(out, tree, 0, "");
  return out;
}

Hyperparameters flatten(const YAML::Node& tree) {
  Hyperparameters out;
  flatten_into(out, tree, "");
  return out;
}

std::string help_text(const Schema& root, const CommandLine& command, const std::vector<std::string>& subcommands,
                      std::string_view description, const YAML::Node& resolved) {
  std::ostringstream out;
  if (command.subcommand.empty()) {
    out << "usage: " << command.program << " {";
    for (std::size_t i = 0; i < subcommands.size(); ++i) out << (i ? "," : "") << subcommands[i];
    out << "} [--config FILE] [--KEY=VALUE ...] [--print_config]\n";
    if (!description.empty()) out << "\n" << description << "\n";
    out << "\nsubcommands (each takes --help):\n";
    const std::vector<std::pair<std::string, std::string>> all{
        {"fit", "train, validating as the trainer settings say (--ckpt_path continues a run)"},
        {"validate", "one pass over the validation data"},
        {"test", "one pass over the test data"},
        {"predict", "the predictions over the predict data"}};
    for (const auto& [name, what] : all)
      if (std::find(subcommands.begin(), subcommands.end(), name) != subcommands.end())
        out << "  " << name << std::string(10 - name.size(), ' ') << what << "\n";
    return out.str();
  }
  out << "usage: " << command.program << " " << command.subcommand
      << " [--config FILE] [--KEY=VALUE | --KEY VALUE ...] [--print_config] [--env_prefix PREFIX]\n";
  if (!description.empty()) out << "\n" << description << "\n";
  out << "\nSources apply in order: defaults, the environment (with --env_prefix), then each --config file and "
         "--KEY=VALUE as given; values are YAML (--trainer.callbacks+=NAME appends a class; "
         "--trainer.callbacks.KEY=VALUE sets an init_arg of the last one).\n\n";
  out << "  --config FILE  a YAML file of these keys (repeatable)\n"
      << "  --print_config  print the resolved config (defaults included) as YAML and exit\n"
      << "  --env_prefix PREFIX  also read PREFIX_TRAINER__MAX_EPOCHS-style environment variables (off by default)\n";
  for (const auto& section : root.children) {
    if (section.kind == Schema::Kind::group) {
      out << "\n" << section.name << ":" << (section.doc.empty() ? "" : " " + section.doc) << "\n";
      if (section.children.empty()) out << "  (no keys)\n";
      for (const auto& c : section.children)
        help_for(out, c, section.name + "." + c.name, 2, resolved[section.name].IsMap() ? resolved[section.name][c.name] : YAML::Node());
    }
  }
  out << "\nother:\n";
  for (const auto& section : root.children)
    if (section.kind != Schema::Kind::group) help_for(out, section, section.name, 2, resolved[section.name]);
  return out.str();
}

}  // namespace fulgur::cli
