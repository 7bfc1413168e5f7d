// tests/cli/tiny.hpp's module as a fulgur::cli program (CPU: single device and DDP, 32-true), for the
// tests that run a CLI program as a user does: DDP workers started by fulgur's launcher.
#include "cli/tiny.hpp"

int main(int argc, char** argv) {
  constexpr auto compiled = fulgur::compatible_trainers(
      boost::hana::tuple_t<fulgur::CPUAccelerator>, boost::hana::tuple_t<fulgur::SingleDeviceStrategy, fulgur::DDPStrategy>,
      boost::hana::tuple_t<fulgur::FloatPrecision>);
  return fulgur::cli::main<tiny::Tiny, tiny::TinyData>(argc, argv, compiled);
}
