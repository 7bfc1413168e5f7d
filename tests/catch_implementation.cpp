// Catch's implementation, compiled once for every test program (it is most of a Catch main's
// compile time). The programs that need their own main (gpu/, checkpoint/) define it; the others
// get catch_main.cpp's from the same static library.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "catch_session.hpp"

int fulgur_tests::run_catch_session(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }
