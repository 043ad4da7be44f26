/* The emulator's C tests' one assertion: CHECK(cond, fmt, ...) counts a failure in `failures`
 * and says where and why on stderr, without stopping, so that one run lists every failed check.
 * A test returns 1 when `failures` is not 0 at its end. */
#ifndef VRAMLAB_EMULATOR_TESTS_CHECK_H
#define VRAMLAB_EMULATOR_TESTS_CHECK_H
#include <stdio.h>

static int failures;

#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      failures++;                                                                                  \
      fprintf(stderr, "%s:%d: FAIL: %s: ", __FILE__, __LINE__, #cond);                             \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fputc('\n', stderr);                                                                         \
    }                                                                                              \
  } while (0)

#endif
