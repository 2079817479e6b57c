/*
 * MPI one-sided atomics for the metaroce libfabric provider: every rank
 * works on windows owned by the others with MPI_Fetch_and_op,
 * MPI_Compare_and_swap, MPI_Accumulate, MPI_Get_accumulate, MPI_Put and
 * MPI_Get under passive (lock_all / flush) and active (fence)
 * synchronization, and the results are checked, including that no
 * concurrent update is lost. Prints "mpi_osc (N ranks): K passed, 0 failed".
 *
 * Run over `--mca btl self,ofi --mca btl_ofi_provider_include metaroce`,
 * Open MPI's osc rdma turns these into libfabric RMA and atomics through
 * its ofi BTL. Two things are left out for Open MPI 4.1.4's sake, not the
 * provider's: compare-and-swap on a rank's own window (osc rdma hands the
 * ofi BTL a null registration handle for the local peer, which crashes
 * in mca_btl_ofi_acswap), and accumulates other than sum and replace
 * (the ofi BTL maps only those, and compare-and-swap, to libfabric and
 * aborts on the rest, though the provider offers every FI_* operation on
 * 64-bit integers).
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ITER 100
#define ARRAY 16

#include "check.h"

/* Window layout (int64_t words): [0] fetch-add counter, [1] compare-swap
 * counter, [2 .. 2 + ARRAY) accumulate array, then one slot per rank. */
#define W_ADD 0
#define W_CAS 1
#define W_ARRAY 2
#define W_SLOT(r) (2 + ARRAY + (r))

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    size_t words = 2 + ARRAY + size;
    int64_t *mem;
    MPI_Alloc_mem(words * sizeof(int64_t), MPI_INFO_NULL, &mem);
    memset(mem, 0, words * sizeof(int64_t));
    MPI_Win win;
    MPI_Win_create(mem, words * sizeof(int64_t), sizeof(int64_t), MPI_INFO_NULL,
                   MPI_COMM_WORLD, &win);

    /* Passive target: every rank adds to every other rank's counters. */
    MPI_Win_lock_all(0, win);
    for (int i = 0; i < ITER; i++) {
        for (int t = 0; t < size; t++) {
            int64_t one = 1, old = -1;
            MPI_Fetch_and_op(&one, &old, MPI_INT64_T, t, W_ADD, MPI_SUM, win);
            MPI_Win_flush(t, win);
            CHECK(old >= 0 && old < (int64_t)ITER * size, "fetch-and-op returned %lld",
                  (long long)old);
        }
    }
    /* Compare-and-swap increments, retrying when another rank got there
     * first; on the other ranks' windows only (see the top). */
    for (int t = 0; t < size; t++) {
        if (t == rank) continue;
        int64_t cur = 0, zero = 0;
        MPI_Fetch_and_op(&zero, &cur, MPI_INT64_T, t, W_CAS, MPI_NO_OP, win);
        MPI_Win_flush(t, win);
        for (int i = 0; i < ITER;) {
            int64_t next = cur + 1, old = -1;
            MPI_Compare_and_swap(&next, &cur, &old, MPI_INT64_T, t, W_CAS, win);
            MPI_Win_flush(t, win);
            if (old == cur) {
                cur = next;
                i++;
            } else {
                CHECK(old > cur, "compare-and-swap went back: %lld < %lld", (long long)old,
                      (long long)cur);
                cur = old;
            }
        }
    }
    /* Accumulate an array (count > 1) and replace this rank's slot. */
    int64_t add[ARRAY];
    for (int i = 0; i < ARRAY; i++) add[i] = i + 1;
    for (int t = 0; t < size; t++) {
        MPI_Accumulate(add, ARRAY, MPI_INT64_T, t, W_ARRAY, ARRAY, MPI_INT64_T, MPI_SUM, win);
        int64_t mine = 1000 + rank, old = -1;
        MPI_Get_accumulate(&mine, 1, MPI_INT64_T, &old, 1, MPI_INT64_T, t, W_SLOT(rank), 1,
                           MPI_INT64_T, MPI_REPLACE, win);
        MPI_Win_flush(t, win);
        CHECK(old == 0, "slot held %lld before the replace", (long long)old);
    }
    MPI_Win_unlock_all(win);
    MPI_Barrier(MPI_COMM_WORLD);

    /* Everyone's updates are in: check this rank's own window. */
    MPI_Win_lock(MPI_LOCK_SHARED, rank, 0, win);
    CHECK(mem[W_ADD] == (int64_t)ITER * size, "fetch-and-op total %lld", (long long)mem[W_ADD]);
    CHECK(mem[W_CAS] == (int64_t)ITER * (size - 1), "compare-and-swap total %lld",
          (long long)mem[W_CAS]);
    for (int i = 0; i < ARRAY; i++)
        CHECK(mem[W_ARRAY + i] == (int64_t)(i + 1) * size, "accumulate [%d] = %lld", i,
              (long long)mem[W_ARRAY + i]);
    for (int r = 0; r < size; r++)
        CHECK(mem[W_SLOT(r)] == 1000 + r, "slot %d = %lld", r, (long long)mem[W_SLOT(r)]);
    MPI_Win_unlock(rank, win);
    MPI_Barrier(MPI_COMM_WORLD);

    /* Active target: put to the next rank, fence, get it back; a sum. */
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    MPI_Win_fence(0, win);
    int64_t v = 7000 + rank;
    MPI_Put(&v, 1, MPI_INT64_T, next, W_SLOT(rank), 1, MPI_INT64_T, win);
    int64_t big = 1 << 20;
    MPI_Accumulate(&big, 1, MPI_INT64_T, next, W_ADD, 1, MPI_INT64_T, MPI_SUM, win);
    MPI_Win_fence(0, win);
    CHECK(mem[W_SLOT(prev)] == 7000 + prev, "put from %d: %lld", prev,
          (long long)mem[W_SLOT(prev)]);
    CHECK(mem[W_ADD] == (int64_t)ITER * size + big, "accumulate under fence: %lld",
          (long long)mem[W_ADD]);
    int64_t got = -1;
    MPI_Get(&got, 1, MPI_INT64_T, next, W_SLOT(rank), 1, MPI_INT64_T, win);
    MPI_Win_fence(0, win);
    CHECK(got == 7000 + rank, "get back: %lld", (long long)got);

    MPI_Win_free(&win);
    MPI_Free_mem(mem);
    long total = 0;
    MPI_Reduce(&checks, &total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("mpi_osc (%d ranks): %ld passed, 0 failed\n", size, total);
        fflush(stdout);
    }
    MPI_Finalize();
    return 0;
}
