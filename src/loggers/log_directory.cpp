#include "fulgur/loggers/log_directory.hpp"
#include "fulgur/detail/atomic_file.hpp"
#include "fulgur/detail/files.hpp"
#include "fulgur/errors.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <sstream>
#include <stdexcept>
#include <system_error>

namespace fulgur::loggers::detail {

void LogDirectory::resolve(const std::string& default_root_dir) {
  if (resolved()) return;  // one logger object keeps its version across fit/validate/test
  const std::string base = options_.save_dir.empty() ? default_root_dir : options_.save_dir;
  const std::string root = options_.name.empty() ? base : base + "/" + options_.name;
  fulgur::detail::require_creatable_folder(root, "the logger's folder (save_dir/name)");  // before the run, not at its first write
  if (options_.version) {
    if (const auto* n = std::get_if<std::int64_t>(&*options_.version))
      version_ = "version_" + std::to_string(*n);
    else
      version_ = std::get<std::string>(*options_.version);
  } else {
    std::int64_t next = 0;
    for (const std::string& name : fulgur::detail::subdirectories(root)) {
      if (name.rfind("version_", 0) != 0) continue;
      std::int64_t n = -1;
      const char* first = name.data() + 8;
      const char* last = name.data() + name.size();
      if (auto [end_of_number, ec] = std::from_chars(first, last, n); ec == std::errc{} && end_of_number == last)
        next = std::max(next, n + 1);
    }
    version_ = "version_" + std::to_string(next);
  }
  path_ = root + "/" + version_;
}

bool LogDirectory::resume(const std::string& version) {
  if (resolved() || options_.version || version.empty()) return false;
  options_.version = version;
  return true;
}

std::vector<std::string> LogDirectory::checkpoint_folders(const std::string& default_root_dir) const {
  std::string logs = options_.save_dir.empty() ? default_root_dir : options_.save_dir;  // as resolve takes it
  if (!options_.name.empty()) logs.append("/").append(options_.name);
  std::vector<std::string> folders;
  for (const std::string& version : fulgur::detail::subdirectories(logs))
    folders.push_back(fulgur::detail::absolute_path(logs + "/" + version + "/checkpoints"));
  return folders;
}

std::string LogDirectory::version_name() const { return version_; }

std::string number_text(double value) {
  if (std::isfinite(value) && value == std::nearbyint(value) && std::abs(value) < 1e15)
    return std::to_string(static_cast<long long>(value));
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char text[32];
  auto [end, ec] = std::to_chars(text, text + sizeof text, value);  // shortest text that reads back the same
  return std::string(text, end);
}

void merge_hyperparameters(Hyperparameters& into, const Hyperparameters& more) {
  for (const auto& entry : more) {
    auto same = std::find_if(into.begin(), into.end(), [&](const auto& e) { return e.first == entry.first; });
    if (same != into.end())
      same->second = entry.second;
    else
      into.push_back(entry);
  }
}

/// A float as YAML 1.1 (PyYAML) reads one back: a dot always, .nan / .inf.
std::string yaml_float(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  char text[40];
  auto [end, ec] = std::to_chars(text, text + sizeof text, v);
  std::string s(text, end);
  const auto e = s.find('e');
  if (s.find('.') == std::string::npos) s.insert(e == std::string::npos ? s.size() : e, ".0");
  return s;
}

void write_hparams_yaml(const std::string& path, const Hyperparameters& hparams) {
  std::ostringstream out;
  if (hparams.empty()) out << "{}\n";
  for (const auto& [name, value] : hparams) {
    out << name << ": ";
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, bool>)
            out << (v ? "true" : "false");
          else if constexpr (std::is_same_v<V, std::int64_t>)
            out << v;
          else if constexpr (std::is_same_v<V, double>)
            out << yaml_float(v);
          else {  // YAML's double-quoted scalar, escaped
            out << '"';
            for (char c : v) {
              if (c == '"' || c == '\\') out << '\\' << c;
              else if (c == '\n') out << "\\n";
              else if (c == '\t') out << "\\t";
              else out << c;
            }
            out << '"';
          }
        },
        value);
    out << '\n';
  }
  fulgur::detail::atomic_write(path, out.str(), "hyperparameters file");
}

}  // namespace fulgur::loggers::detail
