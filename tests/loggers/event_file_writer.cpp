// Writes a known event file for tests/loggers/check_event_file.py, which reads it back with
// TensorBoard's own reader and compares the hparams summaries with torch.utils.tensorboard's.
// Usage: event_file_writer OUTPUT_DIR
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

#include "fulgur/loggers/event_file.hpp"

namespace {
double now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }
}  // namespace

int main(int argc, char** argv) {
  using fulgur::loggers::detail::crc32c;
  using fulgur::loggers::detail::EventFileWriter;

  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  // The CRC-32C check value (RFC 3720 / iSCSI); chaining must give the same result.
  const char check[] = "123456789";
  if (crc32c(check, 9) != 0xE3069283u || crc32c(check + 4, 5, crc32c(check, 4)) != 0xE3069283u) {
    std::fprintf(stderr, "crc32c(\"123456789\") = %08x, expected e3069283\n", static_cast<unsigned>(crc32c(check, 9)));
    return 1;
  }

  try {
    EventFileWriter writer(argv[1]);
    for (int step = 0; step < 5; ++step) writer.add_scalar("loss", 1.0 / (step + 1), step, now());
    writer.add_scalar("acc", 0.75, 4, now());
    const fulgur::Hyperparameters hparams{{"lr", 0.01},
                                          {"batch_size", std::int64_t{32}},
                                          {"optimizer", std::string("adam")},
                                          {"nesterov", true}};
    writer.add_hparams(hparams, {"hp_metric"}, now());
    writer.add_scalar("hp_metric", -1.0, 0, now());
    writer.close();
    writer.close();  // idempotent
    std::printf("%s\n", writer.path().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
