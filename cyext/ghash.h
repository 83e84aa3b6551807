/*
 * grudge-stream hashing kernel: MurmurHash3_x64_128 (first word), SipHash-2-4,
 * splitmix64, CRC-32C and the two index derivations (independent levels, and
 * Kirsch-Mitzenmacher for snapshots and vectors of grudge-stream 0.2 and grudge).
 *
 * Everything here is a static inline function without side effects, so it can
 * be called from nogil Cython loops. Multi-byte loads are little-endian by
 * definition of both hash functions; memcpy keeps them alignment-safe.
 */
#ifndef GRUDGE_GHASH_H
#define GRUDGE_GHASH_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && (__BYTE_ORDER__ == __ORDER_BIG_ENDIAN__)
#define GH_BIG_ENDIAN 1
#endif

static inline uint64_t gh_rotl64(uint64_t x, int r) {
    return (x << r) | (x >> (64 - r));
}

static inline uint64_t gh_load64_le(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#ifdef GH_BIG_ENDIAN
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* ---- MurmurHash3 x64_128 -------------------------------------------------- */

static inline uint64_t gh_fmix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

/* First 64-bit word of MurmurHash3_x64_128 with both seed words = seed32. */
static inline uint64_t gh_murmur3_64(const unsigned char *data, size_t len, uint32_t seed32) {
    const uint64_t c1 = 0x87c37b91114253d5ULL;
    const uint64_t c2 = 0x4cf5ad432745937fULL;
    uint64_t h1 = seed32, h2 = seed32;
    size_t nblocks = len / 16, i;
    for (i = 0; i < nblocks; i++) {
        uint64_t k1 = gh_load64_le(data + i * 16);
        uint64_t k2 = gh_load64_le(data + i * 16 + 8);
        k1 *= c1; k1 = gh_rotl64(k1, 31); k1 *= c2; h1 ^= k1;
        h1 = gh_rotl64(h1, 27); h1 += h2; h1 = h1 * 5 + 0x52dce729;
        k2 *= c2; k2 = gh_rotl64(k2, 33); k2 *= c1; h2 ^= k2;
        h2 = gh_rotl64(h2, 31); h2 += h1; h2 = h2 * 5 + 0x38495ab5;
    }
    const unsigned char *tail = data + nblocks * 16;
    size_t rem = len & 15;
    uint64_t k1 = 0, k2 = 0;
    /* Tail bytes 8..14 feed k2, bytes 0..7 feed k1 (little-endian). */
    if (rem > 8) {
        for (i = rem; i > 8; i--) k2 ^= (uint64_t)tail[i - 1] << ((i - 9) * 8);
        k2 *= c2; k2 = gh_rotl64(k2, 33); k2 *= c1; h2 ^= k2;
    }
    if (rem > 0) {
        size_t n = rem > 8 ? 8 : rem;
        for (i = n; i > 0; i--) k1 ^= (uint64_t)tail[i - 1] << ((i - 1) * 8);
        k1 *= c1; k1 = gh_rotl64(k1, 31); k1 *= c2; h1 ^= k1;
    }
    h1 ^= (uint64_t)len; h2 ^= (uint64_t)len;
    h1 += h2; h2 += h1;
    h1 = gh_fmix64(h1); h2 = gh_fmix64(h2);
    h1 += h2;
    return h1;
}

/* ---- SipHash-2-4 ---------------------------------------------------------- */

#define GH_SIPROUND                                                   \
    do {                                                              \
        v0 += v1; v1 = gh_rotl64(v1, 13); v1 ^= v0; v0 = gh_rotl64(v0, 32); \
        v2 += v3; v3 = gh_rotl64(v3, 16); v3 ^= v2;                   \
        v0 += v3; v3 = gh_rotl64(v3, 21); v3 ^= v0;                   \
        v2 += v1; v1 = gh_rotl64(v1, 17); v1 ^= v2; v2 = gh_rotl64(v2, 32); \
    } while (0)

static inline uint64_t gh_siphash24(const unsigned char *data, size_t len, uint64_t k0, uint64_t k1) {
    /* Initialisation constants: "somepseudorandomlygeneratedbytes". */
    uint64_t v0 = k0 ^ 0x736f6d6570736575ULL;
    uint64_t v1 = k1 ^ 0x646f72616e646f6dULL;
    uint64_t v2 = k0 ^ 0x6c7967656e657261ULL;
    uint64_t v3 = k1 ^ 0x7465646279746573ULL;
    size_t nblocks = len / 8, i;
    for (i = 0; i < nblocks; i++) {
        uint64_t m = gh_load64_le(data + i * 8);
        v3 ^= m;
        GH_SIPROUND; GH_SIPROUND;
        v0 ^= m;
    }
    const unsigned char *tail = data + nblocks * 8;
    uint64_t b = ((uint64_t)len) << 56;
    for (i = len & 7; i > 0; i--) b |= (uint64_t)tail[i - 1] << ((i - 1) * 8);
    v3 ^= b;
    GH_SIPROUND; GH_SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    GH_SIPROUND; GH_SIPROUND; GH_SIPROUND; GH_SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* ---- splitmix64 ----------------------------------------------------------- */

#define GH_GOLDEN 0x9e3779b97f4a7c15ULL

/* One output of splitmix64 from `state`; the state then advances by GH_GOLDEN. */
static inline uint64_t gh_splitmix64(uint64_t state) {
    uint64_t z = state + GH_GOLDEN;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* ---- Kirsch-Mitzenmacher --------------------------------------------------- */

/* index_i = ((h1 + i*h2) mod 2^32) mod m, h1 = low 32 bits, h2 = high 32 bits. */
static inline uint32_t gh_km_index(uint64_t h, uint32_t i, uint32_t m) {
    uint32_t h1 = (uint32_t)h, h2 = (uint32_t)(h >> 32);
    return (uint32_t)(h1 + i * h2) % m;
}

/* ---- independent levels --------------------------------------------------------
 *
 * Level i's index comes from its own 32 bits of hash output. Word 0 is the key's
 * 64-bit hash h itself (already a hash output: levels 0 and 1 take its low and high
 * halves, the two halves Kirsch-Mitzenmacher combines); word j >= 1 is h + j*GH_GOLDEN
 * remixed by one 64 x 64 -> 128-bit multiply by GH_IX_MUL, the product's two halves
 * xored (the "mum" mix of wyhash: one multiply instruction, where a splitmix64
 * finalizer costs two multiplies and three shifts, which the count-min read loop
 * measured 13% slower than Kirsch-Mitzenmacher). Level 2j takes the low half of word
 * j, level 2j+1 the high half; a half x is reduced to [0, m) as (x * m) >> 32
 * (Lemire's multiply-high: no division). Two keys then share all their cells by
 * chance about m^-L (at least 2^-64: a full 64-bit hash collision), where
 * Kirsch-Mitzenmacher's L indexes are all decided by (h1 mod m, h2 mod m). */
#define GH_IX_KM 0
#define GH_IX_INDEPENDENT 1
#define GH_IX_MUL 0xbf58476d1ce4e5b9ULL

static inline uint64_t gh_ix_mix(uint64_t x) {
    __uint128_t p = (__uint128_t)x * GH_IX_MUL;
    return (uint64_t)p ^ (uint64_t)(p >> 64);
}

static inline uint64_t gh_ix_word(uint64_t h, uint32_t j) {
    return j == 0 ? h : gh_ix_mix(h + (uint64_t)j * GH_GOLDEN);
}

static inline uint32_t gh_ix_reduce(uint32_t x, uint32_t m) {
    return (uint32_t)(((uint64_t)x * m) >> 32);
}

static inline uint32_t gh_ix_index(uint64_t h, uint32_t i, uint32_t m) {
    uint64_t w = gh_ix_word(h, i >> 1);
    return gh_ix_reduce((uint32_t)(w >> ((i & 1) * 32)), m);
}

/* All n indexes of h (scheme GH_IX_INDEPENDENT): one multiply per two levels past the
 * first two. */
static inline void gh_ix_indexes(uint64_t h, uint32_t n, uint32_t m, uint32_t *out) {
    uint32_t j;
    uint64_t w = h;
    for (j = 0; 2 * j < n; j++) {
        if (j) w = gh_ix_mix(h + (uint64_t)j * GH_GOLDEN);
        out[2 * j] = gh_ix_reduce((uint32_t)w, m);
        if (2 * j + 1 < n) out[2 * j + 1] = gh_ix_reduce((uint32_t)(w >> 32), m);
    }
}

/* ---- dispatch ---------------------------------------------------------------- */

enum { GH_MURMUR3 = 0, GH_SIPHASH = 1 };

static inline uint64_t gh_hash(int algo, const unsigned char *data, size_t len,
                               uint32_t seed32, uint64_t k0, uint64_t k1) {
    if (algo == GH_SIPHASH) return gh_siphash24(data, len, k0, k1);
    return gh_murmur3_64(data, len, seed32);
}

/* ---- CRC-32C (Castagnoli, reflected 0x82F63B78) -------------------------------
 *
 * Slicing-by-8 in portable C, and the SSE4.2 crc32 instruction where the CPU has it
 * (x86-64 with GCC or Clang; chosen once, at gh_crc32c_init). Both give the same
 * value; the instruction is several times faster, which matters for snapshots (every
 * byte of one is checksummed by each envelope that holds it, and by its chunk).
 * Every module that calls gh_crc32c calls gh_crc32c_init first (at import).
 */

static uint32_t gh_crc32c_table[8][256];
static int gh_crc32c_ready = 0;
static int gh_crc32c_hw = 0;

static inline uint32_t gh_crc32c_sw(uint32_t crc, const unsigned char *p, size_t len) {
    crc = ~crc;
    while (len >= 8) {
        uint64_t w = gh_load64_le(p) ^ (uint64_t)crc;
        crc = gh_crc32c_table[7][w & 0xff] ^ gh_crc32c_table[6][(w >> 8) & 0xff] ^
              gh_crc32c_table[5][(w >> 16) & 0xff] ^ gh_crc32c_table[4][(w >> 24) & 0xff] ^
              gh_crc32c_table[3][(w >> 32) & 0xff] ^ gh_crc32c_table[2][(w >> 40) & 0xff] ^
              gh_crc32c_table[1][(w >> 48) & 0xff] ^ gh_crc32c_table[0][w >> 56];
        p += 8; len -= 8;
    }
    while (len--) crc = gh_crc32c_table[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(GRUDGE_NO_HW_CRC)
#define GH_CRC32C_HAVE_HW 1
#include <nmmintrin.h>

__attribute__((target("sse4.2")))
static uint32_t gh_crc32c_sse42(uint32_t crc, const unsigned char *p, size_t len) {
    uint64_t c = (uint32_t)~crc;
    while (len >= 32) {  /* unrolled: one dependency chain, four words a turn */
        uint64_t w0, w1, w2, w3;
        memcpy(&w0, p, 8); memcpy(&w1, p + 8, 8); memcpy(&w2, p + 16, 8); memcpy(&w3, p + 24, 8);
        c = _mm_crc32_u64(c, w0); c = _mm_crc32_u64(c, w1);
        c = _mm_crc32_u64(c, w2); c = _mm_crc32_u64(c, w3);
        p += 32; len -= 32;
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = _mm_crc32_u64(c, w);
        p += 8; len -= 8;
    }
    while (len--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#endif

static inline void gh_crc32c_init(void) {
    uint32_t i, j, c;
    if (gh_crc32c_ready) return;
    for (i = 0; i < 256; i++) {
        c = i;
        for (j = 0; j < 8; j++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        gh_crc32c_table[0][i] = c;
    }
    for (i = 0; i < 256; i++) {
        c = gh_crc32c_table[0][i];
        for (j = 1; j < 8; j++) {
            c = gh_crc32c_table[0][c & 0xff] ^ (c >> 8);
            gh_crc32c_table[j][i] = c;
        }
    }
#ifdef GH_CRC32C_HAVE_HW
    __builtin_cpu_init();
    gh_crc32c_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
    gh_crc32c_ready = 1;
}

/* crc is the running value (0 to start); returns the updated CRC-32C. */
static inline uint32_t gh_crc32c(uint32_t crc, const unsigned char *p, size_t len) {
#ifdef GH_CRC32C_HAVE_HW
    if (gh_crc32c_hw) return gh_crc32c_sse42(crc, p, len);
#endif
    return gh_crc32c_sw(crc, p, len);
}

/* 1 when gh_crc32c uses the CPU's instruction, 0 for the portable tables. */
static inline int gh_crc32c_hardware(void) { return gh_crc32c_hw; }

/* The portable tables whatever the CPU has (tests compare the two). */
static inline uint32_t gh_crc32c_portable(uint32_t crc, const unsigned char *p, size_t len) {
    return gh_crc32c_sw(crc, p, len);
}

#endif /* GRUDGE_GHASH_H */
