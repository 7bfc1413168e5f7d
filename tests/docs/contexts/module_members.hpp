// Context "module_members": the block is member functions of a module (a torch::nn::Module with
// one layer), as a reader writes them inside their own.
struct ModuleImpl : torch::nn::Module {
  torch::nn::Linear fc{register_module("fc", torch::nn::Linear(8, 3))};
// @block
};
