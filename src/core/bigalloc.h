/*
 * bigalloc.h — large zeroed allocations (the packed weights) on transparent huge pages where the kernel
 * grants them.
 *
 * A step streams every weight once; on 4 KiB pages that is a TLB walk every 4 KiB of each matrix's
 * stream. Linux gives 2 MiB pages to an anonymous mapping that asks for them (madvise MADV_HUGEPAGE,
 * honoured when /sys/kernel/mm/transparent_hugepage/enabled is "always" or "madvise", the usual default);
 * elsewhere, or where it declines, the memory is ordinary pages. Only speed depends on it, never a
 * result. (KV caches stay on ordinary pages: cpu_kv_create says why.)
 */
#ifndef IB_CORE_BIGALLOC_H
#define IB_CORE_BIGALLOC_H
#include <stddef.h>

/* n bytes (n >= 0), zeroed, 64-byte aligned; NULL when out of memory. Blocks of at least 2 MiB are
 * their own mapping, 2 MiB-aligned and asked for huge pages (their pages come on first touch, 2 MiB
 * at a time); blocks of 64 KiB up to 2 MiB are carved one after another from shared mappings of 32 MiB
 * asked for huge pages the same way (never memory a freed block held; a shared mapping is released
 * with its last block); smaller ones, and every block in an AddressSanitizer build (whose leak checker
 * sees heap blocks only), come from the heap. Thread-safe. Free with ib_big_free. */
void *ib_big_alloc(size_t n);

/* Release a block of ib_big_alloc (NULL: nothing). */
void ib_big_free(void *p);

#endif
