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
#include <string.h>

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

/* The whole file at path, malloc'd with a NUL after its *len bytes, or NULL (then *len is 0) when it
 * cannot be read. */
static inline char *check_read_file(const char *path, size_t *len) {
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *buf = n >= 0 && fseek(f, 0, SEEK_SET) == 0 ? (char *)malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) free(buf), buf = NULL;
    fclose(f);
    if (buf) buf[n] = 0, *len = (size_t)n;
    return buf;
}

/* Whether file `name` in directories d1 and d2 holds the same bytes (both readable, not empty). */
static inline int check_same_file(const char *d1, const char *d2, const char *name) {
    char p1[512], p2[512];
    snprintf(p1, sizeof p1, "%s/%s", d1, name);
    snprintf(p2, sizeof p2, "%s/%s", d2, name);
    size_t l1, l2;
    char *a = check_read_file(p1, &l1), *b = check_read_file(p2, &l2);
    const int same = a && b && l1 == l2 && l1 > 0 && memcmp(a, b, l1) == 0;
    free(a);
    free(b);
    return same;
}

/* Check that two integers are equal, printing both. */
#define CHECK_EQ_INT(a, b) CHECK((long long)(a) == (long long)(b), "%lld != %lld", (long long)(a), (long long)(b))

#define TEST_MAIN_END(name)                                                     \
    do {                                                                        \
        printf("%s: %d passed, %d failed\n", (name), check_passed_, check_failed_); \
        return check_failed_ ? 1 : 0;                                           \
    } while (0)

#endif
