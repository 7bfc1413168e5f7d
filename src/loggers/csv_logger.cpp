#include "fulgur/loggers/csv_logger.hpp"
#include "fulgur/detail/files.hpp"
#include "fulgur/errors.hpp"

#include <algorithm>
#include <fstream>
#include <stdexcept>


namespace fulgur {
namespace {
/// A CSV field as Python's csv module writes it: quoted when it holds a comma, a quote or a line break.
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}
}  // namespace

CSVLogger::CSVLogger(LoggerOptions options, std::int64_t flush_logs_every_n_steps)
    : directory_(std::move(options)), flush_every_(std::max<std::int64_t>(1, flush_logs_every_n_steps)) {}

CSVLogger::CSVLogger(CSVLogger&&) noexcept = default;

CSVLogger::~CSVLogger() {
  try {
    if (writer_ && directory_.resolved()) save();
  } catch (...) {  // a destructor cannot report; finalize() does
  }
}

void CSVLogger::set_up(const LoggerSetup& setup) {
  writer_ = setup.global_rank == 0;
  directory_.resolve(setup.root_dir);
}

void CSVLogger::log_metrics(const Metrics& metrics, std::int64_t step) {
  if (!writer_) return;
  std::map<std::string, std::string> row;
  const std::string& prefix = directory_.options().prefix;
  for (const auto& [name, value] : metrics)
    row[prefix.empty() ? name : prefix + "-" + name] = loggers::detail::number_text(value);
  row["step"] = std::to_string(step);
  rows_.push_back(std::move(row));
  if ((step + 1) % flush_every_ == 0) save();
}

void CSVLogger::log_hyperparams(const Hyperparameters& hparams) {
  if (!writer_) return;
  loggers::detail::merge_hyperparameters(hparams_, hparams);
  detail::make_directories(log_dir());
  loggers::detail::write_hparams_yaml(log_dir() + "/hparams.yaml", hparams_);
}

void CSVLogger::save() {
  if (!writer_ || written_ == rows_.size()) return;
  bool new_columns = false;
  for (std::size_t i = written_; i < rows_.size(); ++i)
    for (const auto& [name, value] : rows_[i])
      if (std::find(columns_.begin(), columns_.end(), name) == columns_.end()) {
        columns_.push_back(name);
        new_columns = true;
      }
  std::sort(columns_.begin(), columns_.end());
  write_rows(/*rewrite=*/new_columns || written_ == 0);
}

void CSVLogger::write_rows(bool rewrite) {
  detail::make_directories(log_dir());
  const std::string path = metrics_file();
  // A rewrite goes to a new file renamed over the old one: a crash leaves the old or the new file.
  const std::string target = rewrite ? path + ".tmp" : path;
  std::ofstream out(target, rewrite ? std::ios::trunc : std::ios::app);
  if (!out) throw Error("fulgur: CSVLogger cannot write " + target + "; check that it is writable.");
  if (rewrite) {
    for (std::size_t c = 0; c < columns_.size(); ++c) out << (c ? "," : "") << csv_field(columns_[c]);
    out << '\n';
  }
  for (std::size_t i = rewrite ? 0 : written_; i < rows_.size(); ++i) {
    for (std::size_t c = 0; c < columns_.size(); ++c) {
      auto value = rows_[i].find(columns_[c]);
      out << (c ? "," : "") << (value != rows_[i].end() ? value->second : "");
    }
    out << '\n';
  }
  out.close();
  if (!out) throw Error("fulgur: CSVLogger could not finish writing " + target + " (disk full?).");
  if (rewrite) detail::rename_path(target, path);
  written_ = rows_.size();
}

void CSVLogger::finalize(std::string_view) {
  if (writer_ && directory_.resolved()) save();
}

}  // namespace fulgur
