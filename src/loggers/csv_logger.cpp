#include "fulgur/loggers/csv_logger.hpp"
#include "fulgur/detail/atomic_file.hpp"
#include "fulgur/detail/files.hpp"
#include "fulgur/errors.hpp"
#include "src/detail/error_text.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdlib>
#include <utility>
#include <fstream>
#include <iostream>
#include <iterator>
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

/// The records of a CSV text as csv_field writes them (quoted fields may hold commas, quotes, line breaks).
std::vector<std::vector<std::string>> csv_records(const std::string& text) {
  std::vector<std::vector<std::string>> records;
  std::vector<std::string> record;
  std::string field;
  bool quoted = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quoted) {
      if (c != '"') field += c;
      else if (i + 1 < text.size() && text[i + 1] == '"') field += '"', ++i;
      else quoted = false;
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      record.push_back(std::move(field));
      field.clear();
    } else if (c == '\n') {
      record.push_back(std::move(field));
      field.clear();
      records.push_back(std::move(record));
      record.clear();
    } else if (c != '\r') {
      field += c;
    }
  }
  if (!field.empty() || !record.empty()) {
    record.push_back(std::move(field));
    records.push_back(std::move(record));
  }
  return records;
}

/// The whole file; empty when it is missing (removed since: its rows are gone).
std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
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
  failed_ = false;  // a new stage tries again
  directory_.resolve(setup.root_dir);
}

void CSVLogger::resume(const std::string& version, std::int64_t step) {
  if (directory_.resume(version)) resume_step_ = step;
}

void CSVLogger::log_metrics(const Metrics& metrics, std::int64_t step) {
  if (!writer_ || failed_) return;
  std::map<std::string, std::string> row;
  const std::string& prefix = directory_.options().prefix;
  for (const auto& [name, value] : metrics)
    row[prefix.empty() ? name : prefix + "-" + name] = loggers::detail::number_text(value);
  row["step"] = std::to_string(step);
  rows_.push_back(std::move(row));
  if ((step + 1) % flush_every_ == 0) save();
}

void CSVLogger::log_hyperparams(const Hyperparameters& hparams) {
  if (!writer_ || failed_) return;
  loggers::detail::merge_hyperparameters(hparams_, hparams);
  try {
    detail::make_directories(log_dir());
    loggers::detail::write_hparams_yaml(log_dir() + "/hparams.yaml", hparams_);
  } catch (const std::exception& e) {
    if (!started_) throw;  // nothing written yet: a folder it cannot use is the config's error, said at once
    give_up(e);
  }
}

void CSVLogger::give_up(const std::exception& e) {
  failed_ = true;
  rows_.clear();  // kept, they would only grow
  appending_.reset();
  const std::string why = detail::without_fulgur_prefix(e.what());
  warnings_.push_back("fulgur: CSVLogger '" + std::string(name()) + "' cannot write to " + log_dir() + ": " + why +
                      " It logs nothing more in this run; training goes on, the other loggers and the checkpoints "
                      "are not affected.");
  std::cerr << warnings_.back() << std::endl;
}

void CSVLogger::save() {
  if (!writer_ || failed_ || rows_.empty()) return;
  try {
    save_rows();
  } catch (const std::exception& e) {
    if (!started_) throw;  // its first write: the folder is the config's error (e.g. not writable), said at once
    give_up(e);
  }
}

void CSVLogger::save_rows() {
  bool new_columns = false;
  for (const auto& row : rows_)
    for (const auto& [name, value] : row)
      if (std::find(columns_.begin(), columns_.end(), name) == columns_.end()) {
        columns_.push_back(name);
        new_columns = true;
      }
  std::sort(columns_.begin(), columns_.end());
  write_rows(/*rewrite=*/new_columns || !started_ || !file_intact());
  rows_.clear();
  started_ = true;
}

bool CSVLogger::file_intact() const {
  // Removed or replaced since (a user cleaning up mid-run): rewritten with its header, as Lightning
  // does, rather than appended headerless or into a file no longer in the folder.
  struct stat on_disk {};
  if (::stat(metrics_file().c_str(), &on_disk) != 0) return false;
  struct stat open {};
  return !appending_ || (::fstat(::fileno(appending_.get()), &open) == 0 && open.st_ino == on_disk.st_ino &&
                         open.st_dev == on_disk.st_dev);
}

void CSVLogger::write_rows(bool rewrite) {
  const std::string path = metrics_file();
  auto append_row = [this](std::string& text, auto&& field_of) {
    for (std::size_t c = 0; c < columns_.size(); ++c) {
      if (c) text += ',';
      text += field_of(columns_[c]);
    }
    text += '\n';
  };
  std::string text;
  if (rewrite) {
    // The header changed: the rows already saved are read back and written under it (Lightning
    // does the same), into a new file renamed over the old one, so a crash leaves one or the other.
    // A resumed run takes in the rows its checkpoint's run wrote before the checkpoint.
    appending_.reset();
    const std::int64_t resumed_at = std::exchange(resume_step_, -1);
    std::vector<std::vector<std::string>> saved;
    if (started_ || resumed_at >= 0) saved = csv_records(read_file(path));
    if (resumed_at >= 0 && !saved.empty()) {
      const std::vector<std::string> header = saved.front();
      const auto step_at = std::find(header.begin(), header.end(), "step");
      const auto index = static_cast<std::size_t>(step_at - header.begin());
      saved.erase(std::remove_if(saved.begin() + 1, saved.end(),
                                 [&](const std::vector<std::string>& row) {
                                   if (step_at == header.end() || index >= row.size()) return false;
                                   char* end = nullptr;
                                   const long long step = std::strtoll(row[index].c_str(), &end, 10);
                                   return end != row[index].c_str() && step >= resumed_at;
                                 }),
                  saved.end());
      for (const std::string& column : header)
        if (std::find(columns_.begin(), columns_.end(), column) == columns_.end()) columns_.push_back(column);
      std::sort(columns_.begin(), columns_.end());
    }
    for (std::size_t c = 0; c < columns_.size(); ++c) text += (c ? "," : "") + csv_field(columns_[c]);
    text += '\n';
    if (!saved.empty()) {
      const std::vector<std::string>& header = saved.front();
      for (std::size_t r = 1; r < saved.size(); ++r)
        append_row(text, [&](const std::string& column) {
          const auto at = std::find(header.begin(), header.end(), column);
          const auto index = static_cast<std::size_t>(at - header.begin());
          return at != header.end() && index < saved[r].size() ? csv_field(saved[r][index]) : std::string();
        });
    }
  }
  for (const auto& row : rows_)
    append_row(text, [&](const std::string& column) {
      const auto value = row.find(column);
      return value != row.end() ? value->second : std::string();
    });
  if (rewrite) {  // a new column: the whole file again, replaced atomically
    detail::atomic_write(path, text, "metrics file");
    return;
  }
  // Appending, the file stays open from a run's first save to its end: a save at a log step is one
  // write, not a directory walk and an open every log_every_n_steps.
  if (!appending_) {
    detail::make_directories(log_dir());
    appending_.reset(std::fopen(path.c_str(), "a"));
    if (!appending_)
      throw Error("fulgur: CSVLogger cannot open " + path + ": " + std::strerror(errno) + "; check that it is writable.");
  }
  if (std::fwrite(text.data(), 1, text.size(), appending_.get()) != text.size() || std::fflush(appending_.get()) != 0)
    throw Error("fulgur: CSVLogger could not finish writing " + path + ": " + std::strerror(errno) + ".");
}

void CSVLogger::finalize(std::string_view) {
  if (writer_ && directory_.resolved()) save();
  appending_.reset();  // the run's end: the next run opens the file again
}

}  // namespace fulgur
