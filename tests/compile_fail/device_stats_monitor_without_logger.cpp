// DeviceStatsMonitor sends its values to the loggers: a Trainer with none refuses it with Lightning's
// sentence naming it (not LearningRateMonitor's). The twin adds a CSVLogger.
#include <fulgur/fulgur.hpp>

void make() {
#ifdef FULGUR_COMPILE_FAIL
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision,
                  fulgur::DeviceStatsMonitor>
      trainer(fulgur::TrainerConfig{.max_epochs = 3});
#else
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision,
                  fulgur::DeviceStatsMonitor, fulgur::CSVLogger>
      trainer(fulgur::TrainerConfig{.max_epochs = 3});
#endif
  (void)trainer;
}
