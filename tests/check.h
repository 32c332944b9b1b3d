/*
 * check.h — the tiny test harness every tests/test_*.c uses.
 *
 * CHECK(cond, fmt, ...) records one check; on failure it prints the file, line, the condition and a
 * message (print both values, libuv style). TEST_MAIN_END() prints "<binary>: N passed, N failed"
 * and returns non-zero when anything failed. tests/run.sh adds the counts up.
 */
#ifndef IB_TESTS_CHECK_H
#define IB_TESTS_CHECK_H
#include <stdio.h>
#include <stdlib.h>

static int check_passed_, check_failed_;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (cond) {                                                             \
            check_passed_++;                                                    \
        } else {                                                                \
            check_failed_++;                                                    \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

/* Check that two integers are equal, printing both. */
#define CHECK_EQ_INT(a, b) CHECK((long long)(a) == (long long)(b), "%lld != %lld", (long long)(a), (long long)(b))

#define TEST_MAIN_END(name)                                                     \
    do {                                                                        \
        printf("%s: %d passed, %d failed\n", (name), check_passed_, check_failed_); \
        return check_failed_ ? 1 : 0;                                           \
    } while (0)

#endif
