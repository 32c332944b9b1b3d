/*
 * digest.c — ib_digest_bytes (isobatch.h): 64-bit FNV-1a, used to fingerprint logits and token
 * streams in the invariance tests and the CLI.
 */
#include "isobatch.h"

/* 64-bit FNV-1a over n bytes of data, continuing from h (IB_DIGEST_INIT to start): for each byte,
 * h ^= byte; h *= 0x100000001b3 (mod 2^64). data may be NULL when n == 0. */
uint64_t ib_digest_bytes(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint64_t)p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
