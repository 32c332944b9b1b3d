/*
 * kv_blocks.h — the memory of the CPU backend's KV caches: zeroed blocks, and a process-wide pool that
 * keeps the blocks of ended sessions for the next cache of the same size.
 *
 * A fresh block's pages come from the kernel as the session first writes them: a fault and a zeroed
 * page per 4 KiB (a 128-token prefill of qwen3-0.6b writes 3,600 such pages; on the 2-core VM they
 * were a fifth of the step). A pooled block's written pages are still mapped; the one who gives it
 * back zeroes what its session wrote, so taking it costs nothing and writing it faults no page. A
 * cache takes the smallest pooled block of at least its size and less than twice it (a server's
 * requests size their caches by prompt + max_tokens, so sizes vary): the pages it does not write stay
 * unmapped either way.
 *
 * Bound: the pool holds at most IB_KV_POOL_BLOCKS blocks and at most a budget of resident bytes (what
 * their sessions had written: the pages a block keeps mapped), 512 MiB unless the environment's
 * IB_KV_POOL_MB says otherwise (read once; 0 turns the pool off). Only memory and speed depend on it,
 * never a result: a block from the pool is all zeros, as a fresh one is.
 */
#ifndef IB_BACKENDS_CPU_KV_BLOCKS_H
#define IB_BACKENDS_CPU_KV_BLOCKS_H
#include <stddef.h>

#define IB_KV_POOL_BLOCKS 64

/* A zeroed block of at least n bytes: the smallest pooled one of n to 2n - 1 bytes if there is one,
 * else a fresh one of n; its size into *got. NULL when out of memory. Release with ib_kv_block_give
 * or ib_kv_block_free. */
void *ib_kv_block_take(size_t n, size_t *got);

/* Whether the pool would keep a block of which `resident` bytes were written (so that the caller
 * zeroes it only when it will be kept). The answer may change before ib_kv_block_give. */
int ib_kv_block_wanted(size_t resident);

/* Give back block p of n bytes (from ib_kv_block_take: its *got), all of whose bytes the caller has
 * zeroed, `resident` of them written by its session: the pool keeps it (while it has room), else it is
 * freed. */
void ib_kv_block_give(void *p, size_t n, size_t resident);

/* Free block p (from ib_kv_block_take; NULL: nothing) without pooling it. */
void ib_kv_block_free(void *p);

/* The pool's blocks and resident bytes now (tests, diagnostics). */
void ib_kv_pool_stats(int *blocks, size_t *resident);

#endif
