/*
 * Small inline helpers shared by the sketch kernels (count-min, forgetting Bloom):
 * exact fast modulo, prefetch, cache-line aligned allocation, a wall-clock read.
 * Everything is static inline, allocation-free on the hot path and nogil-safe.
 */
#ifndef GRUDGE_GSKETCH_H
#define GRUDGE_GSKETCH_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Exact a % d for every 32-bit a and d >= 1 without a divide instruction
 * (Lemire, Kaser & Kurz, "Faster remainder by direct computation", 2019):
 * magic = floor((2^64 - 1) / d) + 1, then a % d = high 64 bits of (magic * a mod 2^64) * d.
 * A hardware divide costs ~10-40 cycles; this is two multiplies. */
static inline uint64_t gs_fastmod_magic(uint32_t d) {
    return UINT64_C(0xFFFFFFFFFFFFFFFF) / d + 1;
}
static inline uint32_t gs_fastmod(uint32_t a, uint64_t magic, uint32_t d) {
    uint64_t low = magic * a;
    return (uint32_t)(((__uint128_t)low * d) >> 64);
}

/* Kirsch-Mitzenmacher index i of hash h into [0, d): ((h1 + i*h2) mod 2^32) mod d,
 * identical to gh_km_index (ghash.h) but with the precomputed modulus. */
static inline uint32_t gs_km_index(uint64_t h, uint32_t i, uint64_t magic, uint32_t d) {
    uint32_t h1 = (uint32_t)h, h2 = (uint32_t)(h >> 32);
    return gs_fastmod(h1 + i * h2, magic, d);
}

/* The same index with a power-of-two fast path: pmask = d - 1 when d is a power of
 * two (>= 2), else 0. The branch is the same for every call on one sketch. */
static inline uint32_t gs_km_index_p(uint64_t h, uint32_t i, uint64_t magic, uint32_t d, uint32_t pmask) {
    uint32_t x = (uint32_t)h + i * (uint32_t)(h >> 32);
    return pmask ? (x & pmask) : gs_fastmod(x, magic, d);
}

/* Prefetch for writing / reading, keep in all cache levels. */
static inline void gs_prefetch_w(const void *p) { __builtin_prefetch(p, 1, 3); }
static inline void gs_prefetch_r(const void *p) { __builtin_prefetch(p, 0, 3); }

/* 64-byte aligned, zeroed allocation (NULL on failure); free with free(). */
static inline void *gs_alloc_zeroed(size_t n) {
    void *p = NULL;
    if (n == 0) n = 64;
    if (posix_memalign(&p, 64, n) != 0) return NULL;
    memset(p, 0, n);
    return p;
}

/* Wall-clock milliseconds since the Unix epoch: the same value as
 * grudge_stream.clock.SystemClock().now_ms(), without a Python call. */
static inline int64_t gs_wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + (int64_t)(ts.tv_nsec / 1000000);
}

/* floor(a / b) for b > 0 (C division truncates toward zero). */
static inline int64_t gs_floordiv(int64_t a, int64_t b) {
    int64_t q = a / b;
    if ((a % b) != 0 && a < 0) q -= 1;
    return q;
}

#endif /* GRUDGE_GSKETCH_H */
