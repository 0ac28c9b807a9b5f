// MEMSIM_CHECK: the third kind of failure (style.md rule 7) -- a bug in memsim itself, never
// bad user input. Prints file:line and the condition, then aborts.
#pragma once

#include <cstdio>
#include <cstdlib>

#define MEMSIM_CHECK(cond)                                                              \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "memsim: internal error at %s:%d: check failed: %s\n", __FILE__, \
                   __LINE__, #cond);                                                    \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)
