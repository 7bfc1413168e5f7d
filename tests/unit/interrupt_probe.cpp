// Ctrl-C twice: the first SIGINT under an InterruptHandler is only noted, the second ends the
// process as SIGINT does by default (ctest checks the shell's exit status 130 = 128 + SIGINT).
#include <csignal>
#include <cstdio>

#include "fulgur/interrupt.hpp"

int main() {
  fulgur::InterruptHandler handler(/*enabled=*/true);
  std::raise(SIGINT);
  if (!fulgur::detail::interrupt_requested()) return 1;
  std::printf("first SIGINT noted\n");
  std::fflush(stdout);
  std::raise(SIGINT);  // the default action: the process ends here
  std::printf("second SIGINT did not end the process\n");
  return 2;
}
