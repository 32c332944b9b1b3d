/*
 * bigalloc.c — large zeroed allocations on transparent huge pages (contract in bigalloc.h).
 *
 * Each block is preceded by a 64-byte header (so the caller's pointer stays 64-byte aligned) that
 * says how to release it: the length of its own mapping, or the heap pointer it came from.
 */
#include "core/bigalloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define IB_BIG_HEAP_ONLY 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define IB_BIG_HEAP_ONLY 1
#endif
#endif
#if !defined(__linux__) || !defined(MADV_HUGEPAGE)
#undef IB_BIG_HEAP_ONLY
#define IB_BIG_HEAP_ONLY 1
#endif
#ifndef IB_BIG_HEAP_ONLY
#define IB_BIG_HEAP_ONLY 0
#endif

enum { HEADER = 64 };
#define HUGE_PAGE ((size_t)2 << 20)

typedef struct {
    size_t map_len;   /* bytes of the block's own mapping (it starts at the header); 0: a heap block */
    void *heap;       /* the heap allocation holding the block (map_len == 0) */
} big_header;

/* A heap block: header and data inside one calloc, the data rounded up to 64 bytes. */
static void *heap_block(size_t n) {
    if (n > SIZE_MAX - 2 * HEADER) return NULL;
    unsigned char *raw = calloc(1, n + 2 * HEADER);
    if (!raw) return NULL;
    unsigned char *data = (unsigned char *)(((uintptr_t)raw + 2 * HEADER - 1) & ~(uintptr_t)(HEADER - 1));
    big_header h = {0, raw};
    memcpy(data - HEADER, &h, sizeof h);
    return data;
}

void *ib_big_alloc(size_t n) {
#if IB_BIG_HEAP_ONLY
    return heap_block(n);
#else
    if (n < HUGE_PAGE || n > SIZE_MAX / 2) return heap_block(n);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t len = (HEADER + n + page - 1) / page * page;   /* the block's own pages */
    const size_t span = len + HUGE_PAGE;                        /* room to align its start */
    unsigned char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    unsigned char *base = (unsigned char *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    const size_t head = (size_t)(base - raw), tail = span - head - len;
    if (head) munmap(raw, head);
    if (tail) munmap(base + len, tail);
    (void)madvise(base, len, MADV_HUGEPAGE);   /* a hint: declined, the block is ordinary pages */
    big_header h = {len, NULL};
    memcpy(base, &h, sizeof h);
    return base + HEADER;
#endif
}

void ib_big_free(void *p) {
    if (!p) return;
    big_header h;
    memcpy(&h, (unsigned char *)p - HEADER, sizeof h);
#if !IB_BIG_HEAP_ONLY
    if (h.map_len) {
        munmap((unsigned char *)p - HEADER, h.map_len);
        return;
    }
#endif
    free(h.heap);
}
