/*
 * sha256.h — SHA-256 (FIPS 180-4), written here from the standard. Used where a collision-resistant
 * fingerprint is needed rather than the FNV-1a digest of logits: the model identity (a hash of the
 * files that decide a model's answers) and the session store's owner-key hashes.
 */
#ifndef IB_CORE_SHA256_H
#define IB_CORE_SHA256_H
#include <stddef.h>
#include <stdint.h>

typedef struct ib_sha256 {
    uint32_t h[8];        /* chaining state */
    uint64_t n_bytes;     /* message bytes taken so far */
    uint8_t buf[64];      /* the current partial block */
    int n_buf;            /* bytes in buf */
} ib_sha256;

/* Start a hash. */
void ib_sha256_init(ib_sha256 *c);
/* Feed n bytes (data may be NULL when n == 0); any split of a message gives the same hash. */
void ib_sha256_update(ib_sha256 *c, const void *data, size_t n);
/* Finish: out gets the 32-byte digest; c must be initialised again before reuse. */
void ib_sha256_final(ib_sha256 *c, uint8_t out[32]);
/* One-shot hash of n bytes. */
void ib_sha256_bytes(const void *data, size_t n, uint8_t out[32]);
/* Lower-case hex of a 32-byte digest into hex[65] (NUL-terminated). */
void ib_sha256_hex(const uint8_t d[32], char hex[65]);

#endif
