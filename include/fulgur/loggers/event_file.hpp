#pragma once
// TensorBoard event files (TFRecord framing of `tensorboard.Event` protos), written without
// TensorFlow, TensorBoard or libprotobuf, so loggers can use it from torch-free code. Torch-free.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "fulgur/loggers/hyperparameters.hpp"

namespace fulgur::loggers::detail {

/// CRC-32C (Castagnoli), as TFRecord uses. `crc` is a previous result, to continue over more bytes:
/// crc32c(b, nb, crc32c(a, na)) == crc32c(a then b).
std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc = 0);

/// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8, so a CRC of bytes that
/// themselves hold CRCs stays well distributed.
std::uint32_t masked_crc32c(const void* data, std::size_t size);

/// One event file, named and framed as torch.utils.tensorboard.SummaryWriter names and frames its
/// files, so TensorBoard (and anything reading its logs) reads it as one of theirs.
/// Writes go to a stdio buffer: call flush() to make them visible to a running TensorBoard.
/// Not thread-safe: one writer per thread (loggers write from rank 0's training thread).
class EventFileWriter {
 public:
  /// Creates `directory` (and parents) if needed and a new file in it named
  /// events.out.tfevents.<unix seconds>.<hostname>.<pid>.<n>, starting with the file-version event.
  /// Throws std::runtime_error naming the path and the OS error if either cannot be created.
  explicit EventFileWriter(const std::string& directory);
  ~EventFileWriter();

  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  /// SummaryWriter.add_scalar(tag, value, step, wall_time) with its defaults: a float simple_value,
  /// no plugin metadata (TensorBoard's scalars plugin reads those as scalars).
  void add_scalar(std::string_view tag, double value, std::int64_t step, double wall_time);

  /// The three summaries of torch.utils.tensorboard.summary.hparams(hparams, metrics), byte for byte:
  /// experiment, session start info and session end info (status success), at step 0.
  /// As in torch, where Python's bool is an int: numbers *and* flags become number values
  /// (true -> 1.0) of type DATA_TYPE_FLOAT64; texts become string values of type DATA_TYPE_STRING.
  /// A repeated name acts as in a Python dict: the last value, at the first one's place.
  /// The values' map is written in the deterministic order of Python's protobuf (upb), which
  /// torch's bytes equal after SerializeToString(deterministic=True); by default Python writes it
  /// in hash-table order, which changes from process to process.
  void add_hparams(const fulgur::Hyperparameters& hparams, const std::vector<std::string>& metric_tags,
                   double wall_time);

  /// SummaryWriter(purge_step=step)'s marker: Event{step, session_log: START}. TensorBoard drops the
  /// events of earlier files at this step and later (a run resumed from a checkpoint rewrites them).
  void add_session_start(std::int64_t step, double wall_time);
  /// Hands buffered events to the OS (std::fflush).
  void flush();
  /// Flushes, fsyncs and closes the file. Idempotent; the destructor calls it (and swallows errors).
  void close();

  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& event);
  [[noreturn]] void fail(const char* what, int error) const;

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace fulgur::loggers::detail
