/*
 * kv_blocks.c — zeroed KV cache blocks and the pool of ended sessions' blocks (contract in kv_blocks.h).
 */
#include "backends/cpu/kv_blocks.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct pooled {
    void *p;
    size_t n, resident;
} pooled;

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pooled pool[IB_KV_POOL_BLOCKS];
static int pool_n;               /* blocks held */
static size_t pool_resident;     /* their resident bytes */
static size_t pool_budget;       /* most resident bytes held (set once from IB_KV_POOL_MB) */
static int pool_budget_read;

/* The budget, read from the environment once (under pool_mu). A value that is not a whole number of
 * MiB keeps the default. */
static size_t budget(void) {
    if (!pool_budget_read) {
        pool_budget_read = 1;
        pool_budget = (size_t)512 << 20;
        const char *v = getenv("IB_KV_POOL_MB");
        if (v && *v) {
            char *end;
            const unsigned long long mb = strtoull(v, &end, 10);
            if (!*end && mb < ((unsigned long long)1 << 40)) pool_budget = (size_t)mb << 20;
        }
    }
    return pool_budget;
}

void *ib_kv_block_take(size_t n, size_t *got) {
    if (!n) n = 1;
    pthread_mutex_lock(&pool_mu);
    int best = -1;
    for (int i = 0; i < pool_n; i++)
        if (pool[i].n >= n && pool[i].n - n < n && (best < 0 || pool[i].n < pool[best].n)) best = i;
    if (best >= 0) {
        void *p = pool[best].p;
        *got = pool[best].n;
        pool_resident -= pool[best].resident;
        pool[best] = pool[--pool_n];
        pthread_mutex_unlock(&pool_mu);
        return p;
    }
    pthread_mutex_unlock(&pool_mu);
    *got = n;
    return calloc(1, n);
}

/* Whether a block of `resident` bytes fits now (under pool_mu). */
static int fits(size_t resident) {
    const size_t b = budget();
    return pool_n < IB_KV_POOL_BLOCKS && resident <= b && pool_resident <= b - resident;
}

int ib_kv_block_wanted(size_t resident) {
    pthread_mutex_lock(&pool_mu);
    const int ok = fits(resident);
    pthread_mutex_unlock(&pool_mu);
    return ok;
}

void ib_kv_block_give(void *p, size_t n, size_t resident) {
    if (!p) return;
    pthread_mutex_lock(&pool_mu);
    if (fits(resident)) {
        pool[pool_n++] = (pooled){p, n, resident};
        pool_resident += resident;
        p = NULL;
    }
    pthread_mutex_unlock(&pool_mu);
    free(p);
}

void ib_kv_block_free(void *p) { free(p); }

void ib_kv_pool_stats(int *blocks, size_t *resident) {
    pthread_mutex_lock(&pool_mu);
    if (blocks) *blocks = pool_n;
    if (resident) *resident = pool_resident;
    pthread_mutex_unlock(&pool_mu);
}
