#pragma once
// NoSyncGuard<Reducer>: while alive, the reducer's backward accumulates gradients locally without
// communicating (gradient accumulation micro-batches); null: nothing to do.
namespace fulgur::distributed {

template <class Reducer>
class [[nodiscard]] NoSyncGuard {
 public:
  explicit NoSyncGuard(Reducer* reducer) : reducer_(reducer) {
    if (reducer_) {
      previous_ = reducer_->sync();
      reducer_->set_sync(false);
    }
  }
  ~NoSyncGuard() {
    if (reducer_) reducer_->set_sync(previous_);
  }
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  Reducer* reducer_;
  bool previous_ = true;
};

}  // namespace fulgur::distributed
