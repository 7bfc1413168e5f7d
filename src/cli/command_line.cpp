// fulgur::cli's command line and scalars: the arguments read into an ordered list of sources, YAML
// scalars read as the values' types take them, and the closest name to a typo.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>

#include "fulgur/cli/resolve.hpp"
#include "src/detail/edit_distance.hpp"

namespace fulgur::cli {

// ---- scalars ------------------------------------------------------------------------------------

bool is_null(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return true;
  if (!node.IsScalar() || node.Tag() == "!") return false;
  const std::string& s = node.Scalar();
  return s == "null" || s == "Null" || s == "NULL" || s == "~";
}

std::optional<bool> as_bool(const YAML::Node& node) {
  if (!node.IsDefined() || !node.IsScalar() || node.Tag() == "!") return std::nullopt;
  const std::string& s = node.Scalar();
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  return std::nullopt;
}

std::optional<long long> as_integer(const YAML::Node& node) {
  if (!node.IsDefined() || !node.IsScalar()) return std::nullopt;
  std::string s = node.Scalar();
  if (!s.empty() && s.front() == '+') s.erase(0, 1);
  long long value = 0;
  const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (error != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return value;
}

std::optional<double> as_number(const YAML::Node& node) {
  if (!node.IsDefined() || !node.IsScalar()) return std::nullopt;
  std::string s = node.Scalar();
  if (s == ".inf" || s == ".Inf" || s == "+.inf" || s == "inf") return HUGE_VAL;
  if (s == "-.inf" || s == "-.Inf" || s == "-inf") return -HUGE_VAL;
  if (s == ".nan" || s == ".NaN" || s == "nan") return std::nan("");
  if (!s.empty() && s.front() == '+') s.erase(0, 1);
  double value = 0;
  const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (error != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return value;
}

std::string number_text(double value) {
  if (std::isnan(value)) return ".nan";
  if (std::isinf(value)) return value > 0 ? ".inf" : "-.inf";
  char buffer[64];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
  std::string text(buffer, error == std::errc() ? end : buffer);
  // With a '.' always, before any exponent: YAML 1.1 readers (PyYAML) take "1e-05" for a string.
  const std::size_t exponent = text.find('e');
  if (text.find('.') == std::string::npos) text.insert(exponent == std::string::npos ? text.size() : exponent, ".0");
  return text;
}

YAML::Node string_node(const std::string& text) {
  YAML::Node node(text);
  node.SetTag("!");  // what the parser gives a quoted scalar: a string, whatever its text
  return node;
}

// ---- the command line ----------------------------------------------------------------------------

CommandLine parse_command_line(const std::vector<std::string>& args, const std::vector<std::string>& subcommands,
                               const std::vector<std::string>& offered) {
  CommandLine command;
  command.program = args.empty() ? "program" : std::filesystem::path(args.front()).filename().string();
  std::vector<std::string> problems;
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h" || arg == "--help") {
      command.help = true;
      continue;
    }
    if (command.subcommand.empty()) {
      if (std::find(subcommands.begin(), subcommands.end(), arg) != subcommands.end()) {
        command.subcommand = arg;
        continue;
      }
      std::string list;
      for (const auto& s : offered.empty() ? subcommands : offered) list += (list.empty() ? "" : ", ") + s;
      std::string text = "'" + arg + "' is not a subcommand; the first argument is one of " + list;
      if (const std::string near = closest(arg, offered.empty() ? subcommands : offered); !near.empty())
        text += " (did you mean " + near + "?)";
      problems.push_back(text + ", e.g. `" + command.program + " fit --help`.");
      break;
    }
    if (!arg.starts_with("--")) {
      problems.push_back("'" + arg + "': expected an option --key=value (or --config FILE) after the subcommand.");
      continue;
    }
    std::string key = arg.substr(2), value;
    bool has_value = false;
    if (const auto eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
      has_value = true;
    }
    if (key == "print_config") {
      if (has_value && value != "true" && value != "false") {
        problems.push_back("--print_config takes no value (or true / false), got '" + value + "'");
        continue;
      }
      command.print_config = !has_value || value == "true";
      continue;
    }
    auto take_value = [&]() -> bool {
      if (has_value) return true;
      if (i + 1 < args.size() && !args[i + 1].starts_with("--")) {
        value = args[++i];
        return true;
      }
      problems.push_back("--" + key + " needs a value (--" + key + "=VALUE or --" + key + " VALUE).");
      return false;
    };
    if (key == "config" || key == "env_prefix") {
      if (!take_value()) continue;
      if (key == "config") command.sources.push_back({Source::Kind::file, "", value});
      else command.env_prefix = value;
      continue;
    }
    if (!take_value()) continue;
    const bool append = key.ends_with("+");
    if (append) key.pop_back();
    command.sources.push_back({append ? Source::Kind::append : Source::Kind::set, key, value});
  }
  if (command.subcommand.empty() && !command.help && problems.empty()) {
    std::string list;
    for (const auto& s : offered.empty() ? subcommands : offered) list += (list.empty() ? "" : ", ") + s;
    problems.push_back("give a subcommand: " + list + " (e.g. `" + command.program + " fit --help`).");
  }
  if (!problems.empty()) throw ConfigError(problems);
  return command;
}


// ---- names ---------------------------------------------------------------------------------------

std::string closest(std::string_view given_as_written, const std::vector<std::string>& candidates) {
  // Compared without case: MAX_EPOCHS means max_epochs, earlystopping EarlyStopping.
  const auto lowered = [](std::string_view text) {
    std::string out(text);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
  };
  const std::string given = lowered(given_as_written);
  std::vector<std::string> lowered_candidates;
  lowered_candidates.reserve(candidates.size());
  for (const auto& c : candidates) lowered_candidates.push_back(lowered(c));
  // A key given without its section ("max_epochs" for "trainer.max_epochs").
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const std::string& c = lowered_candidates[i];
    if (c.size() > given.size() && c.ends_with(given) && c[c.size() - given.size() - 1] == '.') return candidates[i];
  }
  // A key cut short ("find_unused" for "find_unused_parameters"), when only one candidate starts so.
  std::size_t prefixed = candidates.size(), starting = 0;
  for (std::size_t i = 0; i < candidates.size(); ++i)
    if (given.size() >= 4 && lowered_candidates[i].starts_with(given)) prefixed = i, ++starting;
  if (starting == 1) return candidates[prefixed];
  std::size_t best = candidates.size();
  std::size_t best_distance = std::string::npos;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    const std::size_t d = fulgur::detail::edit_distance(given, lowered_candidates[i]);
    if (d < best_distance) best_distance = d, best = i;
  }
  const std::size_t allowed = std::max<std::size_t>(1, std::min<std::size_t>(3, given.size() / 4));
  return best_distance <= allowed ? candidates[best] : "";
}

}  // namespace fulgur::cli
