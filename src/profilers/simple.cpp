// SimpleProfiler's report: Lightning's table, character for character (fulgur/profilers/simple.hpp).
#include "fulgur/profilers/simple.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <utility>

#include "fulgur/errors.hpp"
#include "fulgur/profilers/report_file.hpp"

namespace fulgur {
namespace {

/// Python's f"{value:.5}": 'g' with 5 significant digits, scientific from exponent 4 (p - 1) on, and
/// at least one digit after the point in fixed notation.
std::string python_short(double value) {
  constexpr int precision = 5;
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*e", precision - 1, value);
  const std::string sci = buffer;
  const int exponent = std::stoi(sci.substr(sci.find('e') + 1));
  auto strip = [](std::string digits) {
    if (digits.find('.') == std::string::npos) return digits;
    while (digits.back() == '0') digits.pop_back();
    return digits;
  };
  if (exponent >= -4 && exponent < precision - 1) {
    std::snprintf(buffer, sizeof buffer, "%.*f", precision - 1 - exponent, value);
    std::string fixed = strip(buffer);
    if (fixed.back() == '.') fixed += '0';
    return fixed;
  }
  std::string mantissa = strip(sci.substr(0, sci.find('e')));
  if (mantissa.back() == '.') mantissa.pop_back();
  std::snprintf(buffer, sizeof buffer, "e%c%02d", exponent < 0 ? '-' : '+', exponent < 0 ? -exponent : exponent);
  return mantissa + buffer;
}

std::string padded(const std::string& text, std::size_t width) {
  return text.size() >= width ? text : text + std::string(width - text.size(), ' ');
}

/// len(text.expandtabs()) in Python: tabs to 8-column stops, the column starting again after a newline
/// (which counts as a character: Lightning's header starts with one, so its rules are one longer).
std::size_t expanded_length(const std::string& text) {
  std::size_t length = 0, column = 0;
  for (char c : text) {
    const std::size_t width = c == '\t' ? 8 - column % 8 : 1;
    length += width;
    column = c == '\n' ? 0 : column + width;
  }
  return length;
}

std::string upper(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

SimpleProfiler::SimpleProfiler(SimpleProfilerOptions options)
    : options_(std::move(options)), created_(Clock::now()) {}

void SimpleProfiler::grow(std::uint32_t id) {
  const std::size_t needed = std::max<std::size_t>(id + 1, profiling::action_count());
  if (needed > slots_.size()) slots_.resize(std::max(needed, slots_.size() * 2));
}

void SimpleProfiler::set_up(const ProfilerSetup& setup) {
  ready_ = false;  // until the report file is known to be writable: a failed set-up reports nothing
  setup_ = setup;
  grow(0);  // a slot for every action named so far: this run's steps do not resize
  report_path_.clear();
  if (!options_.filename.empty()) {
    const std::string dir = options_.dirpath.empty() ? setup.log_dir : options_.dirpath;
    report_path_ = profiling::open_report_file(dir, profiling::report_file_name(setup, options_.filename, ".txt"),
                                               profiling::folder_origin(!options_.dirpath.empty(),
                                                                        "SimpleProfilerOptions::dirpath"));
  }
  ready_ = true;
}

void SimpleProfiler::record(Action action, std::chrono::nanoseconds duration) {
  if (action.id() >= slots_.size()) grow(action.id());
  slots_[action.id()].total += std::chrono::duration_cast<Clock::duration>(duration);
  ++slots_[action.id()].calls;
}

std::vector<SimpleProfiler::Row> SimpleProfiler::rows() const {
  std::vector<Row> rows;
  for (std::uint32_t id = 0; id < slots_.size(); ++id)
    if (slots_[id].calls > 0)  // a slot's index is its action's id
      rows.push_back({std::string(profiling::action_name(id)), slots_[id].calls,
                      std::chrono::duration_cast<std::chrono::nanoseconds>(slots_[id].total)});
  return rows;
}

std::string SimpleProfiler::summary() const {
  return format_report(rows(), std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - created_),
                       to_string(setup_.stage), options_.extended);
}

std::string SimpleProfiler::format_report(const std::vector<Row>& rows, std::chrono::nanoseconds total,
                                          std::string_view stage, bool extended) {
  const std::string sep = "\n";
  std::string out = stage.empty() ? "" : upper(stage) + " ";
  out += "Profiler Report" + sep;
  if (rows.empty()) return out + sep;  // Lightning prints no table without timings (and fails without extended)
  std::size_t max_key = 0;
  for (const Row& row : rows) max_key = std::max(max_key, row.action.size());
  const double total_s = std::chrono::duration<double>(total).count();
  auto line = [&](const std::string& action, const std::string& mean, const std::string& calls,
                  const std::string& sum, const std::string& percent) {
    std::string text = sep + "|  " + padded(action, max_key) + "\t|  " + padded(mean, 15) + "\t|";
    if (extended) text += "  " + padded(calls, 15) + "\t|  " + padded(sum, 15) + "\t|  " + padded(percent, 15) + "\t|";
    else text += "  " + padded(sum, 15) + "\t|";
    return text;
  };
  const std::string header = extended ? line("Action", "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %")
                                      : line("Action", "Mean duration (s)", "", "Total time (s)", "");
  const std::string rule = sep + std::string(expanded_length(header), '-');
  out += rule + header + rule;
  struct Sorted {
    const Row* row;
    double mean, sum, percent;
  };
  std::vector<Sorted> sorted;
  std::int64_t total_calls = 0;
  for (const Row& row : rows) {
    const double sum = std::chrono::duration<double>(row.total).count();
    sorted.push_back({&row, sum / static_cast<double>(row.calls), sum, total_s > 0 ? 100.0 * sum / total_s : 0.0});
    total_calls += row.calls;
  }
  // Lightning sorts by percentage (extended) or mean (not), descending, keeping first-use order on ties.
  std::stable_sort(sorted.begin(), sorted.end(), [&](const Sorted& a, const Sorted& b) {
    return extended ? a.percent > b.percent : a.mean > b.mean;
  });
  if (extended) {
    out += line("Total", "-", std::to_string(total_calls), python_short(total_s), "100 %");
    out += rule;
  }
  for (const Sorted& s : sorted)
    out += line(s.row->action, python_short(s.mean), std::to_string(s.row->calls), python_short(s.sum),
                python_short(s.percent));
  out += rule + sep;
  return out;
}

void SimpleProfiler::describe() {
  if (!std::exchange(ready_, false)) return;  // its set-up failed: the stage's error says why
  const std::string report = summary();
  if (!report_path_.empty()) profiling::append_report(report_path_, report);
  if (options_.print && setup_.global_rank == 0) std::cout << report << std::flush;
}

}  // namespace fulgur
