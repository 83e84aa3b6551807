/*
 * grudge-stream ScoreSketch kernel helpers: the cell type, a small lock and
 * table allocation. The helpers every kernel shares (prefetch, the wall clock,
 * fast modulo, aligned allocation) are in gsketch.h, included here. Everything
 * is callable without the GIL except gs_lock_acquire_gil (which releases the
 * GIL while it waits).
 */
#ifndef GRUDGE_SCORE_KERNEL_H
#define GRUDGE_SCORE_KERNEL_H

#include <Python.h>
#include <sched.h>
#include "gsketch.h"
#if defined(__linux__)
#include <sys/mman.h>
#endif

/* One cell: 16 bytes, so four cells share a 64-byte line and none straddles one. */
typedef struct {
    double score;
    int64_t last_ms;
} gs_cell;

/* ---- lock ------------------------------------------------------------------
 * Test-and-set with a waiter count. The uncontended path is one atomic
 * exchange (a PyThread lock costs ~15-30 ns per acquire/release on CPython
 * 3.11; this costs ~2). Holders never block while holding it: single-key
 * operations hold it for one event with the GIL, batch loops hold it for one
 * chunk without the GIL and yield between chunks when someone waits. A waiter
 * that holds the GIL releases it before spinning, so the lock and the GIL can
 * never deadlock.
 */
typedef struct {
    int state;
    int waiters;
} gs_lock;

static inline int gs_lock_try(gs_lock *l) {
    return __atomic_exchange_n(&l->state, 1, __ATOMIC_ACQUIRE) == 0;
}

static void gs_lock_wait(gs_lock *l) {
    int spins = 0;
    __atomic_add_fetch(&l->waiters, 1, __ATOMIC_RELAXED);
    for (;;) {
        if (__atomic_load_n(&l->state, __ATOMIC_RELAXED) == 0 && gs_lock_try(l)) break;
        /* 64 polite spins cover a single-key operation; then give the core away. */
        if (++spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        } else {
            sched_yield();
        }
    }
    __atomic_sub_fetch(&l->waiters, 1, __ATOMIC_RELAXED);
}

static inline void gs_lock_acquire_nogil(gs_lock *l) {
    if (!gs_lock_try(l)) gs_lock_wait(l);
}

static inline void gs_lock_acquire_gil(gs_lock *l) {
    if (!gs_lock_try(l)) {
        Py_BEGIN_ALLOW_THREADS
        gs_lock_wait(l);
        Py_END_ALLOW_THREADS
    }
}

static inline void gs_lock_release(gs_lock *l) {
    __atomic_store_n(&l->state, 0, __ATOMIC_RELEASE);
}

/* Between two chunks of a batch: let a waiting thread in. */
static inline void gs_lock_courtesy(gs_lock *l) {
    if (__atomic_load_n(&l->waiters, __ATOMIC_RELAXED) > 0) sched_yield();
}

/* ---- table ----------------------------------------------------------------- */

#define GS_HUGE (2u << 20)

/* Allocate n cells aligned to a cache line (to 2 MiB and advised as huge pages
 * when the table is at least that big: random access over megabytes is
 * otherwise bound by TLB misses). Returns NULL on failure. */
static gs_cell *gs_table_alloc(size_t n) {
    size_t bytes = n * sizeof(gs_cell);
    size_t align = bytes >= GS_HUGE ? GS_HUGE : 64;
    void *p = NULL;
    if (n == 0 || bytes / sizeof(gs_cell) != n) return NULL;
    if (posix_memalign(&p, align, bytes) != 0) return NULL;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (align == GS_HUGE) (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return (gs_cell *)p;
}

/* A fresh cell: score 0, never stamped (INT64_MIN, so any event time decays it). */
static void gs_table_reset(gs_cell *t, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        t[i].score = 0.0;
        t[i].last_ms = INT64_MIN;
    }
}

#endif /* GRUDGE_SCORE_KERNEL_H */
