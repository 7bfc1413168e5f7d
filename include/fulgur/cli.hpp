#pragma once
// fulgur::cli: LightningCLI for C++ programs (docs/cli.md). Link fulgur::cli (yaml-cpp).
#include "fulgur/cli/main.hpp"
