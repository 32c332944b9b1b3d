/*
 * test_kv_blocks.c — the CPU backend's KV cache memory (src/backends/cpu/kv_blocks.h): the pool of ended
 * sessions' blocks.
 *
 * The pool by itself: a block taken fresh is zeroed; a block given back is taken again by a cache of
 * at least its size and less than twice it, the smallest such first, and not by a smaller one; the
 * resident-bytes budget and the block count bound what it keeps. Through sessions (tiny model, CPU
 * backend): a session that wrote 40 positions ends, a new session of the same size takes its block
 * (the pool empties), and that cache is all zeros, byte for byte; the new session's logits for the
 * same tokens are bitwise the first one's. Under the kv-pool-dirty fault (blocks pooled without
 * zeroing what their sessions wrote) the zero check must fail — while the logits still agree, since
 * attention never reads a slot before it is written: only the byte check sees another tenant's keys.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "isobatch.h"
#include "backends/cpu/cpu.h"
#include "backends/cpu/kv_blocks.h"
#include "model/mkmodel.h"
#include "runtime/runtime.h"

static int all_zero(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

static void pool_checks(void) {
    int nb;
    size_t res;
    const size_t M = (size_t)1 << 20;
    size_t got;
    unsigned char *a = ib_kv_block_take(M, &got);
    CHECK(a && got == M && all_zero(a, M), "a fresh block of 1 MiB: zeroed, its own size (got %zu)", got);
    if (!a) return;
    memset(a, 7, 4096);   /* a session writes it, then the caller zeroes what it wrote */
    memset(a, 0, 4096);
    CHECK(ib_kv_block_wanted(4096), "an empty pool wants a block");
    ib_kv_block_give(a, M, 4096);
    ib_kv_pool_stats(&nb, &res);
    CHECK(nb == 1 && res == 4096, "pool after one give: %d blocks, %zu resident bytes (want 1, 4096)", nb, res);
    /* a cache of less than half its size does not take it */
    unsigned char *b = ib_kv_block_take(M / 2, &got);
    CHECK(b && b != a && got == M / 2, "a 512 KiB cache takes a fresh block, not the 1 MiB one");
    ib_kv_block_free(b);
    /* one of more than half its size does, whole */
    unsigned char *c = ib_kv_block_take(M / 2 + 1, &got);
    CHECK(c == a && got == M && all_zero(c, M), "a 512 KiB + 1 cache takes the pooled 1 MiB block (got %zu bytes)", got);
    ib_kv_pool_stats(&nb, &res);
    CHECK(nb == 0 && res == 0, "pool after the take: %d blocks, %zu resident bytes", nb, res);
    /* the smallest fitting block first */
    unsigned char *big = ib_kv_block_take(M + M / 2, &got);
    ib_kv_block_give(big, got, 0);
    ib_kv_block_give(c, M, 0);
    unsigned char *d = ib_kv_block_take(M - 10, &got);
    CHECK(d == c && got == M, "of a 1 MiB and a 1.5 MiB block, a 1 MiB - 10 cache takes the 1 MiB one");
    ib_kv_block_free(d);
    d = ib_kv_block_take(M + M / 2, &got);
    CHECK(d == big, "the 1.5 MiB block is taken by a cache of its size");
    ib_kv_block_free(d);
    /* the budget (512 MiB without IB_KV_POOL_MB) and the count bound */
    CHECK(!ib_kv_block_wanted((size_t)600 << 20), "a block of 600 MiB resident is over the default budget");
    unsigned char *blk[IB_KV_POOL_BLOCKS + 1];
    for (int i = 0; i <= IB_KV_POOL_BLOCKS; i++) blk[i] = ib_kv_block_take(4096, &got);
    for (int i = 0; i <= IB_KV_POOL_BLOCKS; i++) ib_kv_block_give(blk[i], 4096, 0);
    ib_kv_pool_stats(&nb, &res);
    CHECK(nb == IB_KV_POOL_BLOCKS, "%d blocks given: the pool keeps %d (want %d)", IB_KV_POOL_BLOCKS + 1, nb,
          IB_KV_POOL_BLOCKS);
    for (int i = 0; i < nb; i++) ib_kv_block_free(ib_kv_block_take(4096, &got));
    ib_kv_pool_stats(&nb, &res);
    CHECK(nb == 0, "pool emptied: %d blocks left", nb);
}

/* Session A writes 40 positions and ends; session B of the same options takes its block. Returns
 * whether B's cache was all zeros when made, and sets *same_logits to whether B's logits for the same
 * 40 tokens equal A's bitwise. */
static int session_round(const ib_model *m, ib_engine *e, int *same_logits) {
    ib_error err;
    const int V = ib_model_get_info(m)->vocab_size, N = 40;
    int32_t ids[40];
    for (int i = 0; i < N; i++) ids[i] = (int32_t)((i * 37 + 5) % V);
    float *la = malloc((size_t)V * sizeof(float)), *lb = malloc((size_t)V * sizeof(float));
    ib_session_opts so = {.max_context = 64, .sampling = ib_sampling_default(), .kv_dtype = IB_KV_F16};
    ib_session *a = NULL, *b = NULL;
    int zero = 0;
    *same_logits = 0;
    if (!la || !lb || ib_session_create(m, &so, &a, &err)) goto out;
    ib_step_item it = {.session = a, .tokens = ids, .n_tokens = N, .logits = la};
    if (ib_step(e, &it, 1, &err)) goto out;
    ib_session_free(a);
    a = NULL;
    int nb0, nb1;
    ib_kv_pool_stats(&nb0, NULL);
    if (ib_session_create(m, &so, &b, &err)) goto out;
    ib_kv_pool_stats(&nb1, NULL);
    CHECK(nb0 == 1 && nb1 == 0, "the ended session's block pooled (%d) and taken by the new one (%d left)", nb0, nb1);
    const size_t bytes = ib_kv_desc_bytes(&b->kv->desc);
    unsigned char *kb = malloc(bytes);
    if (kb && ib_cpu_kv_read(b->kv, kb, bytes) == 0) zero = all_zero(kb, bytes);
    free(kb);
    it.session = b, it.logits = lb;
    if (ib_step(e, &it, 1, &err)) goto out;
    *same_logits = memcmp(la, lb, (size_t)V * sizeof(float)) == 0;
out:
    ib_session_free(a);
    ib_session_free(b);
    free(la), free(lb);
    return zero;
}

static void session_checks(void) {
    char dir[] = "/tmp/ib_kv_blocks_XXXXXX";
    if (!mkdtemp(dir)) return;
    ib_error err;
    ib_model *m = NULL;
    ib_engine *e = NULL;
    ib_mkmodel_opts mo = {.preset = "tiny", .seed = 3, .bits = 4, .group = 32, .tied = 1};
    if (ib_mkmodel(dir, &mo, &err) || ib_model_load(dir, NULL, &m, &err) || ib_engine_create(m, NULL, &e, &err)) {
        CHECK(0, "tiny model and engine: %s", err.msg);
        return;
    }
    int same;
    int zero = session_round(m, e, &same);
    CHECK(zero, "a session made from an ended session's block has an all-zero cache");
    CHECK(same, "its logits for the same tokens are bitwise the ended session's");
    ib_fault_set(IB_FAULT_KV_POOL_DIRTY);
    zero = session_round(m, e, &same);
    ib_fault_set(IB_FAULT_NONE);
    CHECK(!zero, "FAULT kv-pool-dirty: the zero check must see the ended session's bytes");
    CHECK(same, "FAULT kv-pool-dirty: the logits still agree (no slot is read before it is written)");
    ib_engine_free(e);
    ib_model_free(m);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(void) {
    unsetenv("IB_KV_POOL_MB");   /* the default budget (read once, at the pool's first use) */
    pool_checks();
    session_checks();
    TEST_MAIN_END("test_kv_blocks");
}
