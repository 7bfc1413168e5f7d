// Context "fit": what a doc's `trainer.fit(model, train, val)` refers to. Declared before the
// block: a module type `Net` (also `MyModel`) with every step (tests/docs/support.hpp), a module
// `model`, tensors `x` and `y`, loaders `train`, `val`, `test`, `data`, `train_loader`, `loader`,
// `train_data`, `val_data`, `test_data`, an optimizer `optimizer`, a `trainer` (CPU, one device,
// '32-true') and `compute_loss(model, batch)`. The block is a scope of its own inside a function
// (compiled, never called), so it may declare any of these names again.
using Net = docs_support::Net;
using MyModel = docs_support::Net;
void block() {
  Net model;
  const at::Tensor x = docs_support::inputs(), y = docs_support::targets();
  fulgur::data::TensorLoader train = docs_support::loader(), val = docs_support::loader(),
                             test = docs_support::loader(), data = docs_support::loader();
  fulgur::data::TensorLoader &train_loader = train, &loader = train, &train_data = train, &val_data = val,
                             &test_data = test;
  torch::optim::SGD optimizer(model->parameters(), 0.1);
  fulgur::Trainer<fulgur::CPUAccelerator, fulgur::SingleDeviceStrategy, fulgur::FloatPrecision> trainer;
  auto compute_loss = [](auto& module, const auto& batch) { return module->training_step(batch, 0); };
  {
// @block
  }
}
