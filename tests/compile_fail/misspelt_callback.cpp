// A callback whose only hook is misspelt (on_train_epoch_ends) is refused with one error that says
// so, instead of never being called.
#include <fulgur/fulgur.hpp>

struct EpochPrinter {
#ifdef FULGUR_COMPILE_FAIL
  void on_train_epoch_ends(fulgur::TrainerView& trainer) { trainer.print("epoch done"); }
#else
  void on_train_epoch_end(fulgur::TrainerView& trainer) { trainer.print("epoch done"); }
#endif
};

void make() {
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision, EpochPrinter> trainer;
  (void)trainer;
}
