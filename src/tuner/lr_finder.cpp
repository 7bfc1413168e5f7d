// fulgur::LRFinderResult and the learning-rate finder's rules (Lightning 2.6's tuner/lr_finder.py).
#include "fulgur/tuner/lr_finder_result.hpp"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>

#include "fulgur/detail/files.hpp"
#include "fulgur/errors.hpp"

namespace fulgur {
namespace lr_finder {
namespace detail {
extern const char* const plot_script;  // scripts/plot_lr_find.py (src/tuner/plot_lr_find_script.cpp.in)
}  // namespace detail

double scheduled_lr(const LRFindOptions& options, std::int64_t step) {
  // LRScheduler's constructor steps once (last_epoch 0: base_lrs); each optimizer step then steps it
  // again, so step k >= 1 runs at get_lr() with last_epoch = k, i.e. r = (k + 1) / num_iter.
  if (step <= 0) return options.min_lr;
  const double r = static_cast<double>(step + 1) / static_cast<double>(options.num_training);
  if (options.mode == LRFindMode::linear) return options.min_lr + r * (options.max_lr - options.min_lr);
  return options.min_lr * std::pow(options.max_lr / options.min_lr, r);
}

void check_options(const LRFindOptions& o) {
  auto refuse = [](const std::string& what) { throw MisconfigurationError("lr_find: " + what); };
  if (!(std::isfinite(o.min_lr) && o.min_lr > 0.0))
    refuse("min_lr must be a positive finite number (got " + std::to_string(o.min_lr) +
           "); the search starts there, e.g. 1e-8.");
  if (!(std::isfinite(o.max_lr) && o.max_lr > o.min_lr))
    refuse("max_lr (" + std::to_string(o.max_lr) + ") must be finite and larger than min_lr (" +
           std::to_string(o.min_lr) + "); the learning rate grows from min_lr to max_lr.");
  if (o.num_training < 2)
    refuse("num_training must be at least 2 (got " + std::to_string(o.num_training) +
           "): the learning rates are spread over num_training steps. Lightning's default is 100.");
  if (o.early_stop_threshold && !(std::isfinite(*o.early_stop_threshold) && *o.early_stop_threshold > 0.0))
    refuse("early_stop_threshold must be a positive finite number, or unset (std::nullopt) to never stop early.");
}

double LossTracker::add(double loss, std::int64_t current_step) {
  avg_loss_ = beta_ * avg_loss_ + (1 - beta_) * loss;
  const double smoothed = avg_loss_ / (1 - std::pow(beta_, static_cast<double>(current_step + 1)));
  if (threshold_ && current_step > 1 && smoothed > *threshold_ * best_loss_) stop_ = true;
  if (smoothed < best_loss_ || current_step == 1) best_loss_ = smoothed;
  return smoothed;
}

void raise_optimizer_count(std::size_t count) {
  throw MisconfigurationError("`model.configure_optimizers()` returned " + std::to_string(count) +
                              ", but learning rate finder only works with single optimizer");
}

void raise_no_lr_attribute() {
  throw MisconfigurationError(
      "When using the learning rate finder, either `model` or `model.hparams` should have one of these fields: "
      "('lr', 'learning_rate'). fulgur: update_attr sets a member named `lr` or `learning_rate` (a double); "
      "the module has neither. Add one and read it in configure_optimizers, or leave update_attr false and "
      "use the result's suggestion().");
}

void warn_cut_short(const LRFindOptions& options, std::int64_t steps, std::int64_t epochs) {
  std::cerr << "fulgur: lr_find ran " << steps << " of num_training = " << options.num_training
            << " steps: the training data ran out after " << epochs << " epoch" << (epochs == 1 ? "" : "s")
            << " (max_epochs, limit_train_batches), so the search covered learning rates up to "
            << (steps > 0 ? scheduled_lr(options, steps - 1) : options.min_lr) << ", not max_lr = " << options.max_lr
            << "; give it more batches or epochs, or a smaller num_training." << std::endl;
}

}  // namespace lr_finder

namespace {
/// Why no suggestion: the points recorded (num_training steps while the training data lasts, the
/// reason the search's own notice gives when it ran out) against the skips, or the losses.
std::string too_few_points_advice(std::int64_t between, std::int64_t skip_begin, std::int64_t skip_end) {
  if (between >= 2) return "the losses are NaN or infinite: check the model and data at min_lr";
  if (skip_end == 0) return "skip_end = 0 leaves no point (results[skip_begin:-skip_end], as Lightning): give skip_end >= 1";
  return "a suggestion needs more than skip_begin + skip_end + 1 = " + std::to_string(skip_begin + skip_end + 1) +
         " points: more steps (num_training, and training data that lasts that long) or smaller skips";
}
}  // namespace

std::optional<std::size_t> LRFinderResult::suggestion_index(std::int64_t skip_begin, std::int64_t skip_end) const {
  // Python's results[skip_begin:-skip_end] (so skip_end = 0 leaves nothing, as in Lightning).
  const auto n = static_cast<std::int64_t>(losses.size());
  auto clamp_index = [n](std::int64_t i) { return i < 0 ? std::max<std::int64_t>(0, n + i) : std::min(i, n); };
  const std::int64_t begin = clamp_index(skip_begin), end = clamp_index(-skip_end);
  std::vector<float> kept_losses, kept_lrs;
  std::vector<std::size_t> kept_index;
  for (std::int64_t i = begin; i < end; ++i) {
    const auto at = static_cast<std::size_t>(i);
    const float loss = static_cast<float>(losses[at]);  // torch.tensor(list of floats): float32
    if (!std::isfinite(loss)) continue;
    kept_losses.push_back(loss);
    kept_lrs.push_back(static_cast<float>(lrs[at]));
    kept_index.push_back(at);
  }
  if (kept_losses.size() < 2) {  // Lightning's text, then why
    std::cerr << lr_finder::not_enough_points << " (fulgur: " << n << " points recorded, " << std::max<std::int64_t>(0, end - begin)
              << " of them between skip_begin = " << skip_begin << " and skip_end = " << skip_end << ", "
              << kept_losses.size() << " finite"
              << "; " << too_few_points_advice(end - begin, skip_begin, skip_end) << ".)" << std::endl;
    return std::nullopt;
  }
  const auto count = static_cast<std::int64_t>(kept_losses.size());
  const at::Tensor loss_t = at::from_blob(kept_losses.data(), {count}, at::kFloat).clone();
  const at::Tensor lr_t = at::from_blob(kept_lrs.data(), {count}, at::kFloat).clone();
  const at::Tensor gradients = at::gradient(loss_t, at::TensorList(lr_t), std::optional<std::int64_t>{}, 1)[0];  // torch.gradient(spacing=[lrs])
  return kept_index[static_cast<std::size_t>(gradients.argmin().item<std::int64_t>())];
}

std::optional<double> LRFinderResult::suggestion(std::int64_t skip_begin, std::int64_t skip_end) const {
  const auto index = suggestion_index(skip_begin, skip_end);
  if (!index) return std::nullopt;
  return lrs[*index];
}

void LRFinderResult::write_csv(const std::string& path) const {
  std::ofstream out(path);
  if (!out) throw Error("lr_find: cannot write " + path + "; check that its folder exists and is writable.");
  std::streambuf* err = std::cerr.rdbuf(nullptr);  // the CSV says "none" itself
  const auto index = suggestion_index();
  std::cerr.rdbuf(err);
  out << "# mode=" << (mode == LRFindMode::exponential ? "exponential" : "linear")
      << " suggestion_index=" << (index ? std::to_string(*index) : std::string("none")) << "\n";
  out << "lr,loss\n" << std::setprecision(17);
  for (std::size_t i = 0; i < lrs.size() && i < losses.size(); ++i) out << lrs[i] << "," << losses[i] << "\n";
  if (!out) throw Error("lr_find: writing " + path + " failed (disk full?).");
}

std::string LRFinderResult::text_plot(int width, int height) const {
  std::vector<std::size_t> points;
  for (std::size_t i = 0; i < lrs.size() && i < losses.size(); ++i)
    if (std::isfinite(losses[i]) && lrs[i] > 0) points.push_back(i);
  if (points.empty() || width < 8 || height < 4) return "(no finite loss to plot)\n";
  const bool log_x = mode == LRFindMode::exponential;
  auto x_of = [&](std::size_t i) { return log_x ? std::log10(lrs[i]) : lrs[i]; };
  double x0 = x_of(points.front()), x1 = x0, y0 = losses[points.front()], y1 = y0;
  for (auto i : points) {
    x0 = std::min(x0, x_of(i)), x1 = std::max(x1, x_of(i));
    y0 = std::min(y0, losses[i]), y1 = std::max(y1, losses[i]);
  }
  if (x1 == x0) x1 = x0 + 1;
  if (y1 == y0) y1 = y0 + 1;
  std::vector<std::string> grid(static_cast<std::size_t>(height), std::string(static_cast<std::size_t>(width), ' '));
  auto cell = [&](std::size_t i) -> char& {
    const int col = static_cast<int>(std::lround((x_of(i) - x0) / (x1 - x0) * (width - 1)));
    const int row = static_cast<int>(std::lround((y1 - losses[i]) / (y1 - y0) * (height - 1)));
    return grid[static_cast<std::size_t>(row)][static_cast<std::size_t>(col)];
  };
  for (auto i : points) cell(i) = '.';
  std::streambuf* err = std::cerr.rdbuf(nullptr);
  const auto best = suggestion_index();
  std::cerr.rdbuf(err);
  if (best && std::isfinite(losses[*best])) cell(*best) = '*';
  std::ostringstream out;
  out << std::setprecision(4) << "loss " << y1 << "\n";
  for (const auto& row : grid) out << "|" << row << "\n";
  out << "loss " << y0 << "\n+" << std::string(static_cast<std::size_t>(width), '-') << "\n"
      << "learning rate " << (log_x ? std::pow(10.0, x0) : x0) << " .. " << (log_x ? std::pow(10.0, x1) : x1)
      << (log_x ? " (log scale)" : "");
  if (best) out << "; * suggestion " << lrs[*best];
  out << "\n";
  return out.str();
}

namespace {

/// One shell word: 'it', with each ' inside as '\''.
std::string shell_quoted(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace

std::string LRFinderResult::plot(const std::string& png_path, const std::string& python, const std::string& script) const {
  detail::make_directories(detail::parent_folder(png_path));
  const std::string csv = png_path + ".csv";
  write_csv(csv);
  const std::string has_matplotlib = python + " -c 'import matplotlib' >/dev/null 2>&1";
  if (std::system(has_matplotlib.c_str()) == 0) {
    const std::string arguments = " " + shell_quoted(csv) + " " + shell_quoted(png_path);
    if (!script.empty()) {
      const std::string command = python + " " + shell_quoted(script) + arguments;
      if (std::system(command.c_str()) == 0) return png_path;
      throw Error("lr_find: the plot script failed: " + command);
    }
    // The compiled-in script, from a temporary file (a pipe would let an interpreter that exits early end
    // this process with SIGPIPE).
    std::string file = (std::getenv("TMPDIR") != nullptr ? std::string(std::getenv("TMPDIR")) : "/tmp") +
                       "/fulgur_plot_lr_find_XXXXXX";
    const int fd = ::mkstemp(file.data());
    if (fd < 0) throw Error("lr_find: cannot write the plot script to a temporary file (" + file + ").");
    const std::size_t length = std::strlen(lr_finder::detail::plot_script);
    const bool written = ::write(fd, lr_finder::detail::plot_script, length) == static_cast<ssize_t>(length);
    ::close(fd);
    const std::string command = python + " " + shell_quoted(file) + arguments;
    const bool drawn = written && std::system(command.c_str()) == 0;
    ::unlink(file.c_str());
    if (drawn) return png_path;
    throw Error("lr_find: the plot script (scripts/plot_lr_find.py, compiled in) failed: " + command);
  }
  const std::string txt = png_path + ".txt";
  std::ofstream out(txt);
  out << text_plot();
  if (!out) throw Error("lr_find: cannot write " + txt + ".");
  return txt;
}

}  // namespace fulgur
