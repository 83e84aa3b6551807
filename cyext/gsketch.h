/*
 * Small inline helpers shared by every sketch kernel (score, count-min, forgetting Bloom):
 * exact fast modulo, prefetch, cache-line aligned allocation, a wall-clock read.
 * Everything is static inline, allocation-free on the hot path and nogil-safe.
 */
#ifndef GRUDGE_GSKETCH_H
#define GRUDGE_GSKETCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ghash.h"

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

/* A key's n cell indexes (one per row / level) under index scheme `ix` (GH_IX_INDEPENDENT
 * or GH_IX_KM, ghash.h) into out[0..n). One branch per key, the same for every key of a
 * sketch; the independent scheme computes one remix per two rows past the first two. */
static inline void gs_indexes(int ix, uint64_t h, uint32_t n, uint64_t magic, uint32_t d,
                              uint32_t pmask, uint32_t *out) {
    uint32_t i;
    if (ix == GH_IX_INDEPENDENT) {
        gh_ix_indexes(h, n, d, out);
        return;
    }
    for (i = 0; i < n; i++) out[i] = gs_km_index_p(h, i, magic, d, pmask);
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

/* ---- DecayingCountMin read kernel: depth 4, power-of-two width ----------------------
 *
 * out[i] = min over the 4 rows of the counter of hs[i]'s cell decayed to the epoch whose
 * stamp is emod: for a cell c, g = (emod - (c >> cbits)) & smask idle epochs, and the
 * value is (c & cmask) >> g, or 0 when g >= cbits. The same numbers as the generic loop
 * of _countmin.pyx, computed without a branch: the counter has only cbits bits, so
 * shifting it by min(g, 31) >= cbits already gives 0 (cbits <= 27).
 * The four rows are unrolled, row r's index is (h1 + r*h2) mod 2^32 & (width - 1)
 * (Kirsch-Mitzenmacher, as gs_km_index_p), computed by three additions; the cells of
 * event i + pf are prefetched while event i is read. Specialized at compile time for
 * the default layout (width 65536, counter_bits 24): the masks and shifts become
 * immediates, which frees the registers the runtime parameters would hold. */
static inline __attribute__((always_inline)) void
gs_cm_query4_impl(const uint32_t *cells, const uint64_t *hs, ptrdiff_t n, int64_t *out,
                  uint32_t emod, uint32_t width, uint32_t pmask, int cbits, uint32_t smask,
                  ptrdiff_t pf)
{
    const uint32_t cmask = (UINT32_C(1) << cbits) - 1;
    /* Row k starts at cells + k * width: with a constant width the offsets become
     * address displacements, and the loop needs no register per row. */
    const size_t w1 = width, w2 = 2 * (size_t)width, w3 = 3 * (size_t)width;
    ptrdiff_t i = 0, j, m = n - pf;
#define GS_CMQ_PREFETCH(hv) do {                                                        \
        uint64_t hp_ = (hv);                                                            \
        uint32_t p_ = (uint32_t)hp_, q_ = (uint32_t)(hp_ >> 32);                        \
        __builtin_prefetch(cells + (p_ & pmask), 0, 3); p_ += q_;                       \
        __builtin_prefetch(cells + w1 + (p_ & pmask), 0, 3); p_ += q_;                  \
        __builtin_prefetch(cells + w2 + (p_ & pmask), 0, 3); p_ += q_;                  \
        __builtin_prefetch(cells + w3 + (p_ & pmask), 0, 3);                            \
    } while (0)
#define GS_CMQ_DECAYED(cell) ({                                                         \
        uint32_t c_ = (cell), g_ = (emod - (c_ >> cbits)) & smask;                      \
        g_ = g_ < 31 ? g_ : 31;                                                         \
        (c_ & cmask) >> g_;                                                             \
    })
#define GS_CMQ_ONE(k) do {                                                              \
        uint64_t h_ = hs[k];                                                            \
        uint32_t x_ = (uint32_t)h_, y_ = (uint32_t)(h_ >> 32);                          \
        uint32_t a_ = GS_CMQ_DECAYED(cells[x_ & pmask]); x_ += y_;                      \
        uint32_t b_ = GS_CMQ_DECAYED(cells[w1 + (x_ & pmask)]); x_ += y_;               \
        uint32_t c2_ = GS_CMQ_DECAYED(cells[w2 + (x_ & pmask)]); x_ += y_;              \
        uint32_t d_ = GS_CMQ_DECAYED(cells[w3 + (x_ & pmask)]);                         \
        a_ = a_ < b_ ? a_ : b_;                                                         \
        c2_ = c2_ < d_ ? c2_ : d_;                                                      \
        out[k] = (int64_t)(a_ < c2_ ? a_ : c2_);                                        \
    } while (0)
    for (j = 0; j < (n < pf ? n : pf); j++)
        GS_CMQ_PREFETCH(hs[j]);
    for (; i < m; i++) {
        GS_CMQ_PREFETCH(hs[i + pf]);
        GS_CMQ_ONE(i);
    }
    for (; i < n; i++)
        GS_CMQ_ONE(i);
#undef GS_CMQ_PREFETCH
#undef GS_CMQ_DECAYED
#undef GS_CMQ_ONE
}

/* Prefetch distance in events of the read kernel: ~8 events x 4 rows = 32 loads in
 * flight (4, 5, 6, 12, 16 and 32 measured no better on the 1 MiB default matrix; no
 * prefetch at all was slower than the old generic loop on a loaded machine). */
#define GS_CMQ_PF 8

/* The read kernel for depth 4 and a power-of-two width >= 2 (pmask = width - 1). */
static inline void gs_cm_query4(const uint32_t *cells, const uint64_t *hs, ptrdiff_t n,
                                int64_t *out, uint32_t emod, uint32_t width, uint32_t pmask,
                                int cbits, uint32_t smask)
{
    if (width == 65536 && cbits == 24)
        gs_cm_query4_impl(cells, hs, n, out, emod, 65536, 65535, 24, 255, GS_CMQ_PF);
    else
        gs_cm_query4_impl(cells, hs, n, out, emod, width, pmask, cbits, smask, GS_CMQ_PF);
}

/* ---- the same read kernel under independent levels ---------------------------------
 *
 * Depth 4, any width: rows 0 and 1 index by the halves of h, rows 2 and 3 by the halves
 * of word 1 (gh_ix_word; with the constant width 65536 each reduction is a shift). w of event i + pf is computed once, when its cells are prefetched, and kept
 * in a ring of pf words until event i + pf is read (a ring of the four indexes, or
 * computing w twice, measured slower). */
static inline __attribute__((always_inline)) void
gs_cm_query4_ix_impl(const uint32_t *cells, const uint64_t *hs, ptrdiff_t n, int64_t *out,
                     uint32_t emod, uint32_t width, int cbits, uint32_t smask)
{
    const uint32_t cmask = (UINT32_C(1) << cbits) - 1;
    const size_t w1 = width, w2 = 2 * (size_t)width, w3 = 3 * (size_t)width;
    uint64_t ring[GS_CMQ_PF];
    ptrdiff_t i = 0, j, m = n - GS_CMQ_PF;
#define GS_CMQX_IX(x) gh_ix_reduce((uint32_t)(x), width)
#define GS_CMQX_PREFETCH(k) do {                                                        \
        uint64_t h_ = hs[k], v_ = gh_ix_word(h_, 1);                                    \
        ring[(size_t)(k) & (GS_CMQ_PF - 1)] = v_;                                       \
        __builtin_prefetch(cells + GS_CMQX_IX(h_), 0, 3);                               \
        __builtin_prefetch(cells + w1 + GS_CMQX_IX(h_ >> 32), 0, 3);                    \
        __builtin_prefetch(cells + w2 + GS_CMQX_IX(v_), 0, 3);                          \
        __builtin_prefetch(cells + w3 + GS_CMQX_IX(v_ >> 32), 0, 3);                    \
    } while (0)
#define GS_CMQX_DECAYED(cell) ({                                                        \
        uint32_t c_ = (cell), g_ = (emod - (c_ >> cbits)) & smask;                      \
        g_ = g_ < 31 ? g_ : 31;                                                         \
        (c_ & cmask) >> g_;                                                             \
    })
#define GS_CMQX_ONE(k) do {                                                             \
        uint64_t h_ = hs[k], v_ = ring[(size_t)(k) & (GS_CMQ_PF - 1)];                  \
        uint32_t a_ = GS_CMQX_DECAYED(cells[GS_CMQX_IX(h_)]);                           \
        uint32_t b_ = GS_CMQX_DECAYED(cells[w1 + GS_CMQX_IX(h_ >> 32)]);                \
        uint32_t c2_ = GS_CMQX_DECAYED(cells[w2 + GS_CMQX_IX(v_)]);                     \
        uint32_t d_ = GS_CMQX_DECAYED(cells[w3 + GS_CMQX_IX(v_ >> 32)]);                \
        a_ = a_ < b_ ? a_ : b_;                                                         \
        c2_ = c2_ < d_ ? c2_ : d_;                                                      \
        out[k] = (int64_t)(a_ < c2_ ? a_ : c2_);                                        \
    } while (0)
    for (j = 0; j < (n < GS_CMQ_PF ? n : GS_CMQ_PF); j++)
        GS_CMQX_PREFETCH(j);
    for (; i < m; i++) {
        GS_CMQX_ONE(i);
        GS_CMQX_PREFETCH(i + GS_CMQ_PF);
    }
    for (; i < n; i++)
        GS_CMQX_ONE(i);
#undef GS_CMQX_IX
#undef GS_CMQX_PREFETCH
#undef GS_CMQX_DECAYED
#undef GS_CMQX_ONE
}

/* The independent-levels read kernel for depth 4 (any width >= 1). */
static inline void gs_cm_query4_ix(const uint32_t *cells, const uint64_t *hs, ptrdiff_t n,
                                   int64_t *out, uint32_t emod, uint32_t width, int cbits,
                                   uint32_t smask)
{
    if (width == 65536 && cbits == 24)
        gs_cm_query4_ix_impl(cells, hs, n, out, emod, 65536, 24, 255);
    else
        gs_cm_query4_ix_impl(cells, hs, n, out, emod, width, cbits, smask);
}

/* ---- DecayingCountMin write kernel: depth 4, independent levels ---------------------
 *
 * The plain batch (one weight w <= cmask, one epoch, no candidate set) over depth 4: each
 * of the key's cells decayed to the epoch whose stamp is emod, w added (saturating at
 * cmask), stamped; the same numbers as the generic loop of _countmin.pyx (its branch on
 * g < cbits becomes a shift by min(g, 31): the counter has only cbits bits). Row indexes
 * as in gs_cm_query4_ix, word 1 of event i + pf kept in a ring from its prefetch on. */
static inline __attribute__((always_inline)) void
gs_cm_inc4_ix_impl(uint32_t *cells, const uint64_t *hs, ptrdiff_t n, uint32_t w,
                   uint32_t emod, uint32_t width, int cbits, uint32_t smask)
{
    const uint32_t cmask = (UINT32_C(1) << cbits) - 1, stamp = emod << cbits;
    const size_t w1 = width, w2 = 2 * (size_t)width, w3 = 3 * (size_t)width;
    uint64_t ring[GS_CMQ_PF];
    ptrdiff_t i = 0, j, m = n - GS_CMQ_PF;
#define GS_CMIX_IX(x) gh_ix_reduce((uint32_t)(x), width)
#define GS_CMIX_PREFETCH(k) do {                                                        \
        uint64_t h_ = hs[k], v_ = gh_ix_word(h_, 1);                                    \
        ring[(size_t)(k) & (GS_CMQ_PF - 1)] = v_;                                       \
        __builtin_prefetch(cells + GS_CMIX_IX(h_), 1, 3);                               \
        __builtin_prefetch(cells + w1 + GS_CMIX_IX(h_ >> 32), 1, 3);                    \
        __builtin_prefetch(cells + w2 + GS_CMIX_IX(v_), 1, 3);                          \
        __builtin_prefetch(cells + w3 + GS_CMIX_IX(v_ >> 32), 1, 3);                    \
    } while (0)
#define GS_CMIX_BUMP(p) do {                                                            \
        uint32_t *p_ = (p), c_ = *p_, g_ = (emod - (c_ >> cbits)) & smask;              \
        g_ = g_ < 31 ? g_ : 31;                                                         \
        c_ = ((c_ & cmask) >> g_) + w;                                                  \
        *p_ = stamp | (c_ < cmask ? c_ : cmask);                                        \
    } while (0)
#define GS_CMIX_ONE(k) do {                                                             \
        uint64_t h_ = hs[k], v_ = ring[(size_t)(k) & (GS_CMQ_PF - 1)];                  \
        GS_CMIX_BUMP(cells + GS_CMIX_IX(h_));                                           \
        GS_CMIX_BUMP(cells + w1 + GS_CMIX_IX(h_ >> 32));                                \
        GS_CMIX_BUMP(cells + w2 + GS_CMIX_IX(v_));                                      \
        GS_CMIX_BUMP(cells + w3 + GS_CMIX_IX(v_ >> 32));                                \
    } while (0)
    for (j = 0; j < (n < GS_CMQ_PF ? n : GS_CMQ_PF); j++)
        GS_CMIX_PREFETCH(j);
    for (; i < m; i++) {
        GS_CMIX_ONE(i);
        GS_CMIX_PREFETCH(i + GS_CMQ_PF);
    }
    for (; i < n; i++)
        GS_CMIX_ONE(i);
#undef GS_CMIX_IX
#undef GS_CMIX_PREFETCH
#undef GS_CMIX_BUMP
#undef GS_CMIX_ONE
}

static inline void gs_cm_inc4_ix(uint32_t *cells, const uint64_t *hs, ptrdiff_t n, uint32_t w,
                                 uint32_t emod, uint32_t width, int cbits, uint32_t smask)
{
    if (width == 65536 && cbits == 24)
        gs_cm_inc4_ix_impl(cells, hs, n, w, emod, 65536, 24, 255);
    else
        gs_cm_inc4_ix_impl(cells, hs, n, w, emod, width, cbits, smask);
}

#endif /* GRUDGE_GSKETCH_H */
