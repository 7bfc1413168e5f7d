#pragma once
// When fit writes a checkpoint: a save asked for while a batch or an epoch's end is under way (a
// callback's, the module's, a preemption's) waits for that batch or epoch to finish, so that every
// checkpoint holds a state the loop can continue from exactly: after batch k of epoch e, or
// before epoch e + 1. Removals (ModelCheckpoint's worse files) follow the saves.
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace fulgur::detail {

/// The Trainer's handle on the fit under way or the last one (save_checkpoint after fit).
class FitCheckpointing {
 public:
  virtual ~FitCheckpointing() = default;
  /// Writes now between batches, or queues until the batch or epoch under way ends.
  virtual void request_save(const std::string& path, bool weights_only) = 0;
  virtual void request_removal(const std::string& path) = 0;
};

class CheckpointQueue {
 public:
  using Write = std::function<void(const std::string& path, bool weights_only)>;
  using Remove = std::function<void(const std::string& path)>;
  CheckpointQueue(Write write, Remove remove) : write_(std::move(write)), remove_(std::move(remove)) {}

  void save(const std::string& path, bool weights_only) {
    if (busy_) saves_.emplace_back(path, weights_only);
    else write_(path, weights_only);
  }
  void remove(const std::string& path) {
    if (busy_ && !saves_.empty()) removals_.push_back(path);  // never before the save that replaces it
    else remove_(path);
  }
  /// While true, saves wait for flush().
  void set_busy(bool busy) { busy_ = busy; }
  bool pending() const { return !saves_.empty() || !removals_.empty(); }
  void flush() {
    auto saves = std::move(saves_);
    auto removals = std::move(removals_);
    saves_.clear(), removals_.clear();
    for (const auto& [path, weights_only] : saves) write_(path, weights_only);
    for (const auto& path : removals) remove_(path);
  }

 private:
  Write write_;
  Remove remove_;
  bool busy_ = false;
  std::vector<std::pair<std::string, bool>> saves_;
  std::vector<std::string> removals_;
};

}  // namespace fulgur::detail
