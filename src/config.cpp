// TrainerConfig's checks (detail::validate_config): run when a Trainer is built, before any
// policy is, so that a value that cannot work is named with its fix before anything starts.
#include <string>
#include <vector>

#include "fulgur/detail/describe.hpp"
#include "fulgur/detail/host_terms.hpp"
#include "fulgur/errors.hpp"
#include "fulgur/trainer.hpp"

namespace fulgur::detail {
namespace {

std::string text(const BatchAmount& amount) {
  return amount.is_fraction() ? number_text(amount.fraction()) : std::to_string(amount.count());
}

/// Every value that cannot work, collected so that one run names them all (a config with three
/// mistakes is not three failed runs); raised as one MisconfigurationError.
class Refusals {
 public:
  void refuse(const std::string& field, const std::string& rule, const std::string& got) {
    lines_.push_back(trainer_setting(field) + " " + rule + ", got " + got + ".");
  }
  void at_least(const char* field, std::int64_t value, std::int64_t minimum, const char* meaning = "") {
    if (value < minimum)
      refuse(field, "must be >= " + std::to_string(minimum) + std::string(meaning), std::to_string(value));
  }
  /// A number of batches >= 0, or a fraction in [0, 1].
  void batches(const char* field, const BatchAmount& amount) {
    if (amount.is_fraction() && !(amount.fraction() >= 0.0 && amount.fraction() <= 1.0))
      refuse(field, "as a fraction of the batches must lie in [0, 1] (an integer counts batches)", text(amount));
    if (!amount.is_fraction() && amount.count() < 0) refuse(field, "as a number of batches must be >= 0", text(amount));
  }
  void raise_if_any() const {
    if (lines_.empty()) return;
    if (lines_.size() == 1) throw MisconfigurationError(lines_.front());
    std::string message = trainer_settings_name() + " has " + std::to_string(lines_.size()) + " problems:";
    for (const auto& line : lines_) message += "\n  " + line;
    throw MisconfigurationError(message);
  }

 private:
  std::vector<std::string> lines_;
};

}  // namespace

void validate_config(const TrainerConfig& c) {
  Refusals r;
  if (c.max_epochs) r.at_least("max_epochs", *c.max_epochs, -1, " (-1: no limit)");
  r.at_least("min_epochs", c.min_epochs, 0);
  r.at_least("max_steps", c.max_steps, -1, " (-1: no limit)");
  r.at_least("min_steps", c.min_steps, 0);
  if (c.max_time && !(c.max_time->count() >= 0))  // NaN too: it would be no limit at all
    r.refuse("max_time", "must be a duration >= 0 (unset: no limit)", number_text(c.max_time->count()) + " s");
  r.at_least("accumulate_grad_batches", c.accumulate_grad_batches, 1);
  if (c.gradient_clip_val && !(*c.gradient_clip_val >= 0.0))
    r.refuse("gradient_clip_val", "must be >= 0 (0 or unset: no clipping)", number_text(*c.gradient_clip_val));
  r.at_least("num_nodes", c.num_nodes, 1);
  r.at_least("max_restarts", c.max_restarts, 0, " (0: a failed worker ends the run)");
  if (const int* n = std::get_if<int>(&c.devices); n && *n == 0)
    r.refuse("devices", "must ask for at least one device (an int > 0, -1 for all, or with CUDAAccelerator a list of device ids such as \"0,1\")", "0");
  const BatchAmount& interval = c.val_check_interval;
  if (interval.is_fraction() && !(interval.fraction() > 0.0 && interval.fraction() <= 1.0))
    r.refuse("val_check_interval", "as a fraction of an epoch must lie in (0, 1] (an integer counts batches)",
             text(interval));
  else if (!interval.is_fraction() && interval.count() < 1)
    r.refuse("val_check_interval", "as a number of training batches must be >= 1", text(interval));
  else if (!c.check_val_every_n_epoch && interval.is_fraction())
    r.refuse("val_check_interval", "must be an integer (a number of batches) when check_val_every_n_epoch is unset",
             text(interval));
  if (c.check_val_every_n_epoch) r.at_least("check_val_every_n_epoch", *c.check_val_every_n_epoch, 1);
  r.at_least("num_sanity_val_steps", c.num_sanity_val_steps, -1, " (-1: all validation batches)");
  r.batches("limit_train_batches", c.limit_train_batches);
  r.batches("limit_val_batches", c.limit_val_batches);
  r.batches("limit_test_batches", c.limit_test_batches);
  r.batches("limit_predict_batches", c.limit_predict_batches);
  r.at_least("log_every_n_steps", c.log_every_n_steps, 1);
  r.at_least("max_consecutive_skipped_steps", c.max_consecutive_skipped_steps, 0, " (0: never stop)");
  if (c.default_root_dir.empty()) r.refuse("default_root_dir", "must name a folder (\".\" for the current one)", "\"\"");
  // 0 tells a scheduler or a script that the job succeeded, so a preempted run would never be requeued; a
  // process's exit status is the code modulo 256, so 256 is 0 too.
  if (c.preemption.exit_code < 1 || c.preemption.exit_code > 255)
    r.refuse("preemption.exit_code",
             "must lie in [1, 255] and not mean success (0 tells a scheduler or script that the job finished, so a "
             "preempted run would not be requeued; the exit status is taken modulo 256): keep the default " +
                 std::to_string(preempted_exit_code) + " (EX_TEMPFAIL, fulgur::preempted_exit_code, \"try again\")",
             std::to_string(c.preemption.exit_code));
  r.raise_if_any();
}

}  // namespace fulgur::detail
