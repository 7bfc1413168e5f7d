// The default main of fulgur's Catch programs (the implementation is catch_implementation.cpp).
#include "catch_session.hpp"

int main(int argc, char* argv[]) { return fulgur_tests::run_catch_session(argc, argv); }
