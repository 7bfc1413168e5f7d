// A callback that needs constructor arguments (EarlyStopping: its monitor) named among the Trainer's
// template arguments but not given to its constructor: one error saying to pass it, not the
// constructor overloads. The twin passes it.
#include <fulgur/fulgur.hpp>

void make() {
  using Trainer = fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision,
                                  fulgur::ModelCheckpoint, fulgur::EarlyStopping>;
#ifdef FULGUR_COMPILE_FAIL
  Trainer trainer(fulgur::TrainerConfig{.max_epochs = 3});
#else
  Trainer trainer(fulgur::TrainerConfig{.max_epochs = 3}, fulgur::ModelCheckpoint(),
                  fulgur::EarlyStopping({.monitor = "val_loss"}));
#endif
  (void)trainer;
}
