/*
 * test_bigalloc.c — large zeroed allocations on huge pages (src/core/bigalloc.c).
 *
 * Every block, from 0 bytes to several MiB (either side of the 2 MiB line where a block becomes a
 * mapping of its own), comes back zeroed, 64-byte aligned and writable to its last byte without
 * touching another block; free takes NULL. Where this build maps large blocks itself (Linux, not an
 * AddressSanitizer build) and the kernel's transparent huge pages are "always" or "madvise", a block
 * of 6 MiB must lie in a mapping the kernel says may take huge pages (smaps' THPeligible): without
 * the madvise, or with a mapping whose start is not 2 MiB-aligned, the check fails. Skipped, with a
 * message, where that cannot be read. Blocks of 64 KiB up to 2 MiB are carved from shared mappings:
 * there a block of 1 MiB must be eligible too, and the shared mapping must be gone once its last block
 * is freed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/bigalloc.h"

#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

/* Whether every byte of p[0..n) is zero. */
static int all_zero(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

/* The transparent-huge-page mode ("always", "madvise", "never"), or "" when it cannot be read. */
static void thp_mode(char *out, size_t cap) {
    char s[256] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");   /* sysfs: read, not sized */
    out[0] = 0;
    if (!f) return;
    if (!fgets(s, sizeof s, f)) s[0] = 0;
    fclose(f);
    char *a = strchr(s, '['), *b = a ? strchr(a, ']') : NULL;
    if (a && b && (size_t)(b - a) < cap) memcpy(out, a + 1, (size_t)(b - a - 1)), out[b - a - 1] = 0;
}

/* smaps' THPeligible of the mapping that holds address p: 1 or 0, -1 when not found or not reported. */
static int thp_eligible(const void *p) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int in = 0, r = -1;
    const uintptr_t a = (uintptr_t)p;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            if (in) break;   /* past the mapping without the field */
            in = a >= lo && a < hi;
        } else if (in && sscanf(line, "THPeligible: %d", &r) == 1) {
            break;
        }
    }
    fclose(f);
    return in ? r : -1;
}

/* Whether address p lies in a mapping of this process (/proc/self/maps): 1 or 0, -1 when unreadable. */
static int mapped(const void *p) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[512];
    int r = 0;
    const uintptr_t a = (uintptr_t)p;
    while (!r && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && a >= lo && a < hi) r = 1;
    }
    fclose(f);
    return r;
}

int main(void) {
    static const size_t sizes[] = {0, 1, 63, 64, 65, 4096, 100000, (2u << 20) - 65, (2u << 20) - 64, 2u << 20,
                                   (2u << 20) + 1, (5u << 20) + 7, 9u << 20};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    unsigned char *blk[NS];
    for (int i = 0; i < NS; i++) {
        blk[i] = ib_big_alloc(sizes[i]);
        CHECK(blk[i] != NULL, "%zu bytes: no block", sizes[i]);
        if (!blk[i]) continue;
        CHECK((uintptr_t)blk[i] % 64 == 0, "%zu bytes: block at %p is not 64-byte aligned", sizes[i], (void *)blk[i]);
        CHECK(all_zero(blk[i], sizes[i]), "%zu bytes: not zeroed", sizes[i]);
        memset(blk[i], 0xA0 + i, sizes[i]);   /* every byte, the last included */
    }
    /* each block still holds its own pattern: none overlaps another */
    for (int i = 0; i < NS; i++) {
        if (!blk[i]) continue;
        size_t bad = sizes[i];
        for (size_t k = 0; k < sizes[i] && bad == sizes[i]; k++)
            if (blk[i][k] != (unsigned char)(0xA0 + i)) bad = k;
        CHECK(bad == sizes[i], "%zu bytes: byte %zu was overwritten", sizes[i], bad);
    }
    for (int i = 0; i < NS; i++) ib_big_free(blk[i]);
    ib_big_free(NULL);

    /* a block freed and allocated again comes back zeroed (a fresh mapping, or calloc) */
    for (int round = 0; round < 3; round++) {
        unsigned char *p = ib_big_alloc(3u << 20);
        CHECK(p && all_zero(p, 3u << 20), "round %d: a 3 MiB block after a freed one is not zeroed", round);
        if (p) memset(p, 0xFF, 3u << 20);
        ib_big_free(p);
    }

    char mode[32];
    thp_mode(mode, sizeof mode);
    if (SANITIZED) {
        printf("test_bigalloc: huge-page check not run (sanitizer build: every block is a heap block)\n");
    } else if (strcmp(mode, "always") != 0 && strcmp(mode, "madvise") != 0) {
        printf("test_bigalloc: huge-page check not run (transparent huge pages: \"%s\")\n", mode);
    } else {
        unsigned char *p = ib_big_alloc(6u << 20);
        int e = p ? thp_eligible(p + (3u << 20)) : -2;
        if (e == -1) {
            printf("test_bigalloc: huge-page check not run (smaps reports no THPeligible)\n");
        } else {
            CHECK(e == 1, "a 6 MiB block's mapping may not take huge pages (THPeligible %d, mode %s)", e, mode);
        }
        ib_big_free(p);
        /* blocks below 2 MiB share a mapping that may take huge pages, released with its last block */
        unsigned char *a = ib_big_alloc(1u << 20), *b = ib_big_alloc(300000), *c = ib_big_alloc((2u << 20) - 64);
        CHECK(a && b && c, "shared-mapping blocks: no block");
        if (a && b && c && e != -1) {
            e = thp_eligible(a + (512u << 10));
            CHECK(e == 1, "a 1 MiB block's mapping may not take huge pages (THPeligible %d, mode %s)", e, mode);
            ib_big_free(a);
            ib_big_free(c);
            CHECK(mapped(b) == 1, "a shared mapping was released while a block of it was live");
            ib_big_free(b);
            CHECK(mapped(b) == 0, "a shared mapping is still mapped after its last block was freed");
        } else {
            ib_big_free(a), ib_big_free(b), ib_big_free(c);
        }
    }
    TEST_MAIN_END("test_bigalloc");
}
