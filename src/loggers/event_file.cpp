// TensorBoard event files written by hand. An event file is a TFRecord file of serialized
// `tensorboard.Event` protos, and the few messages fulgur writes (Event, Summary, Summary.Value,
// SummaryMetadata, PluginData, and the hparams plugin's HParamsPluginData, Experiment,
// HParamInfo, MetricInfo, MetricName, SessionStartInfo, SessionEndInfo, google.protobuf.Value)
// are small and fixed, so a varint / length-delimited encoder of a few dozen lines covers them.
// We deliberately do not depend on libprotobuf: LibTorch links its own protobuf, and a second
// copy (or generated code built against a different version) risks ODR clashes and version skew
// for no gain. Field numbers are those of tensorboard/compat/proto/{event,summary}.proto,
// tensorboard/plugins/hparams/{api,plugin_data}.proto and google/protobuf/struct.proto; fields
// are written in field-number order, proto3 defaults are left out, as protobuf's serializers do,
// so the bytes equal those of torch.utils.tensorboard (tests/loggers/check_event_file.py checks).
#include "fulgur/loggers/event_file.hpp"
#include "fulgur/detail/files.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <variant>

namespace fulgur::loggers::detail {

namespace {

constexpr std::array<std::uint32_t, 256> make_crc32c_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected Castagnoli
    table[i] = c;
  }
  return table;
}

constexpr auto crc32c_table = make_crc32c_table();  // built at compile time

// TensorFlow/PyTorch number files per process so two writers started in one second don't collide.
std::atomic<std::uint64_t> next_file_number{0};

void put_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xffu);
}

enum class Wire : std::uint8_t { varint = 0, fixed64 = 1, length_delimited = 2, fixed32 = 5 };

// One protobuf message being built. Callers append fields in field-number order and leave out
// proto3 implicit-presence fields that hold their default, as protobuf itself does.
class Message {
 public:
  Message& varint(int field, std::uint64_t v) {
    key(field, Wire::varint);
    put_varint(v);
    return *this;
  }
  Message& int64(int field, std::int64_t v) { return varint(field, static_cast<std::uint64_t>(v)); }
  Message& float64(int field, double v) {
    key(field, Wire::fixed64);
    put_le(out_, std::bit_cast<std::uint64_t>(v), 8);
    return *this;
  }
  Message& float32(int field, float v) {
    key(field, Wire::fixed32);
    put_le(out_, std::bit_cast<std::uint32_t>(v), 4);
    return *this;
  }
  Message& bytes(int field, std::string_view v) {
    key(field, Wire::length_delimited);
    put_varint(v.size());
    out_.append(v);
    return *this;
  }
  Message& message(int field, const Message& m) { return bytes(field, m.out_); }
  const std::string& str() const { return out_; }

 private:
  void key(int field, Wire wire) {
    put_varint((static_cast<std::uint64_t>(field) << 3) | static_cast<std::uint8_t>(wire));
  }
  void put_varint(std::uint64_t v) {
    for (; v >= 0x80; v >>= 7) out_ += static_cast<char>((v & 0x7fu) | 0x80u);
    out_ += static_cast<char>(v);
  }
  std::string out_;
};

double seconds_since_epoch(std::chrono::system_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

// tensorboard.Event with its wall_time (1) and step (2); proto3 leaves out +0.0 and 0.
Message event(double wall_time, std::int64_t step) {
  Message e;
  if (std::bit_cast<std::uint64_t>(wall_time) != 0) e.float64(1, wall_time);
  if (step != 0) e.int64(2, step);
  return e;
}

// Summary{value: [Value{tag: 1, metadata: 9 {plugin_data: 1 {plugin_name: 1, content: 2}}}]}
Message hparams_summary(std::string_view tag, const Message& content) {
  Message plugin_data;
  plugin_data.bytes(1, "hparams").bytes(2, content.str());
  Message metadata;
  metadata.message(1, plugin_data);
  Message value;
  value.bytes(1, tag).message(9, metadata);
  Message summary;
  summary.message(1, value);
  return summary;
}

// HParamsPluginData with version (1) = PLUGIN_DATA_VERSION = 0, left out; `data` is a oneof, so
// its message is written even when empty.
Message plugin_data(int data_field, const Message& data) {
  Message m;
  m.message(data_field, data);
  return m;
}

bool is_text(const HyperparameterValue& v) { return std::holds_alternative<std::string>(v); }

// google.protobuf.Value (a oneof, always written): string_value (3) for texts, number_value (2)
// for the rest, since torch tests isinstance(v, (int, float)) first and Python's bool is an int.
Message struct_value(const HyperparameterValue& v) {
  Message m;
  std::visit(
      [&m](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          m.bytes(3, x);
        } else {
          m.float64(2, static_cast<double>(x));
        }
      },
      v);
  return m;
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint32_t c = ~crc;
  for (std::size_t i = 0; i < size; ++i) c = crc32c_table[(c ^ p[i]) & 0xffu] ^ (c >> 8);
  return ~c;
}

std::uint32_t masked_crc32c(const void* data, std::size_t size) {
  const std::uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

EventFileWriter::EventFileWriter(const std::string& directory) {
  if (!directory.empty()) {
    try {
      fulgur::detail::make_directories(directory);  // POSIX: see detail/files.hpp
    } catch (const std::runtime_error& e) {
      throw std::runtime_error(std::string(e.what()) + " (the TensorBoard log directory: pass a save_dir you can write to)");
    }
  }

  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  const auto now = std::chrono::system_clock::now();
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
  char name[384];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%lld.%llu", static_cast<long long>(seconds), host,
                static_cast<long long>(::getpid()),
                static_cast<unsigned long long>(next_file_number.fetch_add(1)));
  path_ = directory.empty() ? name : directory + "/" + name;

  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) {
    const int error = errno;
    throw std::runtime_error("fulgur: cannot create the TensorBoard event file '" + path_ + "': " +
                             std::strerror(error) + ". Check that the directory is writable and has free space.");
  }
  try {
    write_event(event(seconds_since_epoch(now), 0).bytes(3, "brain.Event:2").str());
    flush();  // TensorBoard lists the run as soon as the file has its version event
  } catch (...) {
    std::fclose(std::exchange(file_, nullptr));
    throw;
  }
}

EventFileWriter::~EventFileWriter() {
  try {
    close();
  } catch (...) {
    // A destructor must not throw; callers who need to know call close() themselves.
  }
}

void EventFileWriter::add_scalar(std::string_view tag, double value, std::int64_t step, double wall_time) {
  Message v;
  if (!tag.empty()) v.bytes(1, tag);
  v.float32(2, static_cast<float>(value));  // simple_value is a float and sits in a oneof: always written
  Message summary;
  summary.message(1, v);
  write_event(event(wall_time, step).message(5, summary).str());
}

void EventFileWriter::add_session_start(std::int64_t step, double wall_time) {
  Message session_log;
  session_log.varint(1, 1);  // SessionLog.status = START
  write_event(event(wall_time, step).message(7, session_log).str());
}

void EventFileWriter::add_hparams(const fulgur::Hyperparameters& hparams, const std::vector<std::string>& metric_tags,
                                  double wall_time) {
  // torch takes a dict: a repeated name keeps its first place and its last value.
  std::vector<std::pair<std::string_view, const HyperparameterValue*>> unique;
  for (const auto& hparam : hparams) {
    auto it = std::find_if(unique.begin(), unique.end(), [&](const auto& u) { return u.first == hparam.first; });
    if (it == unique.end()) {
      unique.emplace_back(hparam.first, &hparam.second);
    } else {
      it->second = &hparam.second;
    }
  }

  Message experiment;
  for (const auto& [name, value] : unique) {
    Message info;  // HParamInfo: name (1), type (4): DATA_TYPE_STRING = 1, DATA_TYPE_FLOAT64 = 3
    if (!name.empty()) info.bytes(1, name);
    info.varint(4, is_text(*value) ? 1 : 3);
    experiment.message(4, info);
  }
  for (const auto& tag : metric_tags) {
    Message metric_name;  // MetricName: tag (2)
    if (!tag.empty()) metric_name.bytes(2, tag);
    experiment.message(5, Message().message(1, metric_name));  // MetricInfo: name (1)
  }

  // SessionStartInfo.hparams (1) is a map; map entries always carry key (1) and value (2).
  // Python's protobuf (upb) writes a map in hash-table order, seeded per process, so torch's bytes
  // are only reproducible in its deterministic order, which we use: bytewise, except that a key
  // comes after the longer keys it begins ("lr_decay" before "lr"), as upb sorts.
  std::sort(unique.begin(), unique.end(), [](const auto& a, const auto& b) {
    const std::size_t common = std::min(a.first.size(), b.first.size());
    const int order = a.first.substr(0, common).compare(b.first.substr(0, common));
    return order != 0 ? order < 0 : a.first.size() > b.first.size();
  });
  Message start;
  for (const auto& [name, value] : unique) start.message(1, Message().bytes(1, name).message(2, struct_value(*value)));

  Message end;
  end.varint(1, 1);  // SessionEndInfo.status = STATUS_SUCCESS

  // Same order as SummaryWriter.add_hparams: experiment, start, end; global_step None -> no step.
  const auto write = [&](std::string_view tag, int data_field, const Message& data) {
    write_event(event(wall_time, 0).message(5, hparams_summary(tag, plugin_data(data_field, data))).str());
  };
  write("_hparams_/experiment", 2, experiment);
  write("_hparams_/session_start_info", 3, start);
  write("_hparams_/session_end_info", 4, end);
}

void EventFileWriter::flush() {
  if (file_ != nullptr && std::fflush(file_) != 0) fail("cannot write", errno);
}

void EventFileWriter::close() {
  if (file_ == nullptr) return;
  std::FILE* f = std::exchange(file_, nullptr);
  int error = 0;
  // EINVAL: the file system has no fsync (some FUSE/network mounts); the data still reached the OS.
  if (std::fflush(f) != 0 || (::fsync(::fileno(f)) != 0 && errno != EINVAL)) error = errno;
  if (std::fclose(f) != 0 && error == 0) error = errno;
  if (error != 0) fail("cannot finish writing", error);
}

void EventFileWriter::write_event(const std::string& data) {
  if (file_ == nullptr) {
    throw std::logic_error("fulgur: the TensorBoard event file '" + path_ +
                           "' is closed; log through a new EventFileWriter.");
  }
  // TFRecord: uint64 length, masked CRC of those 8 bytes, data, masked CRC of the data (little-endian).
  std::string header;
  put_le(header, data.size(), 8);
  put_le(header, masked_crc32c(header.data(), 8), 4);
  std::string footer;
  put_le(footer, masked_crc32c(data.data(), data.size()), 4);
  if (std::fwrite(header.data(), 1, header.size(), file_) != header.size() ||
      std::fwrite(data.data(), 1, data.size(), file_) != data.size() ||
      std::fwrite(footer.data(), 1, footer.size(), file_) != footer.size()) {
    fail("cannot write", errno);
  }
}

void EventFileWriter::fail(const char* what, int error) const {
  throw std::runtime_error("fulgur: " + std::string(what) + " the TensorBoard event file '" + path_ + "': " +
                           std::strerror(error) + ". Check free disk space and that the directory is still writable.");
}

}  // namespace fulgur::loggers::detail
