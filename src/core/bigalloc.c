/*
 * bigalloc.c — large zeroed allocations on transparent huge pages (contract in bigalloc.h).
 *
 * Each block is preceded by a 64-byte header (so the caller's pointer stays 64-byte aligned) that
 * says how to release it: the length of its own mapping, the shared chunk it was carved from, or the
 * heap pointer it came from.
 *
 * Blocks of ARENA_MIN bytes up to 2 MiB are carved, one after another, from shared chunks: mappings of
 * CHUNK bytes, 2 MiB-aligned and asked for huge pages like a large block. A small model's packed
 * matrices are mostly below 2 MiB (qwen3-0.6b's q/k/v/o and MLP matrices at 4 bits are 0.5-1.6 MiB,
 * their scales and biases less): from the heap they were on 4 KiB pages, so every 4 KiB of a product's
 * weight stream was a TLB walk, and a 1024 -> 3072 product of 16 rows from memory ran about 20% slower
 * than on huge pages (docs/cpu.md, "Matrices below 2 MiB on huge pages too"). A chunk's memory is
 * never handed out twice: each block is fresh, zero memory; a chunk counts its live blocks and is
 * unmapped when the last is freed (so blocks of two lifetimes in one chunk keep the first's touched
 * pages until the second's are freed too).
 */
#include "core/bigalloc.h"

#include <pthread.h>
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

/* Blocks of at least this many bytes (and below HUGE_PAGE) come from the shared chunks; smaller ones
 * (norm weights, tiny matrices) from the heap, where they waste no huge page of their own. */
#define ARENA_MIN ((size_t)64 << 10)
/* Bytes of one shared chunk's mapping (a multiple of HUGE_PAGE). Only the huge pages it hands out
 * become resident: the untouched rest of a chunk costs address space only. */
#define CHUNK ((size_t)32 << 20)

/* A shared chunk: this header in its first 64 bytes, then blocks (each after its own big_header). */
typedef struct {
    size_t used;   /* bytes carved so far, this header included */
    long live;     /* blocks carved and not yet freed */
} chunk;

typedef struct {
    size_t map_len;   /* bytes of the block's own mapping (it starts at the header); 0: not a mapping */
    void *heap;       /* the heap allocation holding the block (map_len == 0, arena NULL) */
    chunk *arena;     /* the shared chunk the block was carved from (map_len == 0), or NULL */
} big_header;

/* A heap block: header and data inside one calloc, the data rounded up to 64 bytes. */
static void *heap_block(size_t n) {
    if (n > SIZE_MAX - 2 * HEADER) return NULL;
    unsigned char *raw = calloc(1, n + 2 * HEADER);
    if (!raw) return NULL;
    unsigned char *data = (unsigned char *)(((uintptr_t)raw + 2 * HEADER - 1) & ~(uintptr_t)(HEADER - 1));
    big_header h = {0, raw, NULL};
    memcpy(data - HEADER, &h, sizeof h);
    return data;
}

#if !IB_BIG_HEAP_ONLY
/* A fresh mapping of len bytes (a multiple of the page size), 2 MiB-aligned and asked for huge pages;
 * NULL when out of memory. */
static unsigned char *huge_map(size_t len) {
    const size_t span = len + HUGE_PAGE;   /* room to align its start */
    unsigned char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    unsigned char *base = (unsigned char *)(((uintptr_t)raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    const size_t head = (size_t)(base - raw), tail = span - head - len;
    if (head) munmap(raw, head);
    if (tail) munmap(base + len, tail);
    (void)madvise(base, len, MADV_HUGEPAGE);   /* a hint: declined, the mapping is ordinary pages */
    return base;
}

static pthread_mutex_t arena_mu = PTHREAD_MUTEX_INITIALIZER;
static chunk *arena_cur;   /* the chunk blocks are carved from now (NULL: none yet, or released) */

/* A block of n bytes (ARENA_MIN <= n < HUGE_PAGE) carved from the current shared chunk, or from a new
 * one when it has no room left (the old one stays until its last live block is freed); NULL when out
 * of memory. */
static void *arena_block(size_t n) {
    const size_t need = HEADER + (n + HEADER - 1) / HEADER * HEADER;   /* header + data, 64-byte steps */
    pthread_mutex_lock(&arena_mu);
    if (!arena_cur || CHUNK - arena_cur->used < need) {
        arena_cur = (chunk *)huge_map(CHUNK);
        if (arena_cur) arena_cur->used = HEADER, arena_cur->live = 0;
    }
    unsigned char *h = NULL;
    if (arena_cur) {
        h = (unsigned char *)arena_cur + arena_cur->used;
        arena_cur->used += need;
        arena_cur->live++;
        big_header bh = {0, NULL, arena_cur};
        memcpy(h, &bh, sizeof bh);
    }
    pthread_mutex_unlock(&arena_mu);
    return h ? h + HEADER : NULL;
}

/* Release a block of chunk c: the chunk is unmapped with its last live block. */
static void arena_free(chunk *c) {
    pthread_mutex_lock(&arena_mu);
    if (--c->live == 0) {
        if (c == arena_cur) arena_cur = NULL;   /* its memory is not zero any more: never carved again */
        munmap(c, CHUNK);
    }
    pthread_mutex_unlock(&arena_mu);
}
#endif

void *ib_big_alloc(size_t n) {
#if IB_BIG_HEAP_ONLY
    return heap_block(n);
#else
    if (n >= ARENA_MIN && n < HUGE_PAGE) return arena_block(n);
    if (n < HUGE_PAGE || n > SIZE_MAX / 2) return heap_block(n);
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t len = (HEADER + n + page - 1) / page * page;   /* the block's own pages */
    unsigned char *base = huge_map(len);
    if (!base) return NULL;
    big_header h = {len, NULL, NULL};
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
    if (h.arena) {
        arena_free(h.arena);
        return;
    }
#endif
    free(h.heap);
}
