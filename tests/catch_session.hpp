#pragma once
// Catch's Session is declared only where its implementation is compiled (catch_implementation.cpp):
// the mains of fulgur's test programs run it through this.
namespace fulgur_tests {
int run_catch_session(int argc, char* argv[]);
}
