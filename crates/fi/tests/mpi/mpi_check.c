/*
 * An MPI test program for the metaroce libfabric provider: point-to-point
 * messages of every size class with their contents checked, probes and
 * matched probes, non-blocking requests, cancellation, and the
 * collectives. Any failure prints what and where and aborts; success
 * prints "mpi_check: N passed, 0 failed".
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static unsigned char pattern(int src, int seq, size_t i) {
    return (unsigned char)((src * 131 + seq * 31 + i * 7 + (i >> 8)) & 0xff);
}

static void fill(unsigned char *b, size_t n, int src, int seq) {
    for (size_t i = 0; i < n; i++) b[i] = pattern(src, seq, i);
}

static size_t first_bad(const unsigned char *b, size_t n, int src, int seq) {
    for (size_t i = 0; i < n; i++)
        if (b[i] != pattern(src, seq, i)) return i;
    return n;
}

/* Every size from 0 to 4 MiB: powers of two and their neighbours. */
static int sizes(size_t *out) {
    int n = 0;
    out[n++] = 0;
    for (size_t p = 1; p <= (4u << 20); p <<= 1) {
        if (p > 2) out[n++] = p - 1;
        out[n++] = p;
        out[n++] = p + 1;
    }
    return n;
}

static void ring_pt2pt(void) {
    size_t sz[80];
    int n = sizes(sz);
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    unsigned char *s = malloc((4u << 20) + 1), *r = malloc((4u << 20) + 1);
    for (int k = 0; k < n; k++) {
        MPI_Status st;
        int cnt;
        fill(s, sz[k], rank, k);
        memset(r, 0xee, sz[k]);
        MPI_Sendrecv(s, (int)sz[k], MPI_BYTE, next, k, r, (int)sz[k], MPI_BYTE, prev, k,
                     MPI_COMM_WORLD, &st);
        MPI_Get_count(&st, MPI_BYTE, &cnt);
        CHECK(cnt == (int)sz[k], "size %zu: got count %d", sz[k], cnt);
        CHECK(st.MPI_SOURCE == prev && st.MPI_TAG == k, "size %zu: source %d tag %d", sz[k],
              st.MPI_SOURCE, st.MPI_TAG);
        size_t bad = first_bad(r, sz[k], prev, k);
        CHECK(bad == sz[k], "size %zu from %d: byte %zu wrong", sz[k], prev, bad);
    }
    /* Blocking send/recv between 0 and every other rank (both directions). */
    for (int peer = 1; peer < size; peer++) {
        for (int k = 0; k < n; k += 3) {
            if (rank == 0) {
                fill(s, sz[k], 0, k);
                MPI_Send(s, (int)sz[k], MPI_BYTE, peer, 100 + k, MPI_COMM_WORLD);
                MPI_Recv(r, (int)sz[k], MPI_BYTE, peer, 200 + k, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                CHECK(first_bad(r, sz[k], peer, k) == sz[k], "echo from %d size %zu", peer, sz[k]);
            } else if (rank == peer) {
                MPI_Recv(r, (int)sz[k], MPI_BYTE, 0, 100 + k, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                CHECK(first_bad(r, sz[k], 0, k) == sz[k], "from 0 size %zu", sz[k]);
                fill(s, sz[k], peer, k);
                MPI_Send(s, (int)sz[k], MPI_BYTE, 0, 200 + k, MPI_COMM_WORLD);
            }
        }
    }
    free(s);
    free(r);
}

static void probes(void) {
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    const size_t lens[] = {0, 5, 4096, 100000, 1 << 20};
    for (int k = 0; k < 5; k++) {
        size_t n = lens[k];
        unsigned char *s = malloc(n + 1), *r = malloc(n + 1);
        fill(s, n, rank, 50 + k);
        MPI_Request rq;
        MPI_Isend(s, (int)n, MPI_BYTE, next, 300 + k, MPI_COMM_WORLD, &rq);
        MPI_Status st;
        int cnt;
        if (k % 2 == 0) {
            MPI_Probe(MPI_ANY_SOURCE, 300 + k, MPI_COMM_WORLD, &st);
        } else {
            int flag = 0;
            while (!flag) MPI_Iprobe(prev, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st);
        }
        MPI_Get_count(&st, MPI_BYTE, &cnt);
        CHECK(st.MPI_SOURCE == prev && st.MPI_TAG == 300 + k && cnt == (int)n,
              "probe %d: source %d tag %d count %d", k, st.MPI_SOURCE, st.MPI_TAG, cnt);
        MPI_Recv(r, (int)n, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        CHECK(first_bad(r, n, prev, 50 + k) == n, "probed message %d content", k);
        MPI_Wait(&rq, MPI_STATUS_IGNORE);

        /* Matched probe: the message is taken out of matching. */
        fill(s, n, rank, 60 + k);
        MPI_Isend(s, (int)n, MPI_BYTE, next, 400 + k, MPI_COMM_WORLD, &rq);
        MPI_Message msg;
        if (k % 2 == 0) {
            MPI_Mprobe(prev, 400 + k, MPI_COMM_WORLD, &msg, &st);
        } else {
            int flag = 0;
            while (!flag) MPI_Improbe(MPI_ANY_SOURCE, 400 + k, MPI_COMM_WORLD, &flag, &msg, &st);
        }
        MPI_Get_count(&st, MPI_BYTE, &cnt);
        CHECK(st.MPI_SOURCE == prev && cnt == (int)n, "mprobe %d: source %d count %d", k,
              st.MPI_SOURCE, cnt);
        memset(r, 0, n);
        if (k % 2 == 0) {
            MPI_Mrecv(r, (int)n, MPI_BYTE, &msg, &st);
        } else {
            MPI_Request mr;
            MPI_Imrecv(r, (int)n, MPI_BYTE, &msg, &mr);
            MPI_Wait(&mr, &st);
        }
        CHECK(first_bad(r, n, prev, 60 + k) == n, "mrecv %d content", k);
        MPI_Wait(&rq, MPI_STATUS_IGNORE);
        free(s);
        free(r);
    }
    /* A probe for a message nobody sent finds nothing. */
    int flag = 1;
    MPI_Iprobe(MPI_ANY_SOURCE, 9999, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    CHECK(!flag, "iprobe found a message that was never sent");
    MPI_Barrier(MPI_COMM_WORLD);
}

static void nonblocking(void) {
    enum { W = 32 };
    const size_t lens[] = {8, 1000, 20000, 300000};
    for (int l = 0; l < 4; l++) {
        size_t n = lens[l];
        unsigned char *s = malloc(n * W * size), *r = malloc(n * W * size);
        MPI_Request rq[2 * W * 4];
        int q = 0;
        for (int peer = 0; peer < size; peer++) {
            if (peer == rank) continue;
            for (int w = 0; w < W; w++) {
                unsigned char *rb = r + (size_t)(peer * W + w) * n;
                MPI_Irecv(rb, (int)n, MPI_BYTE, peer, 500 + w, MPI_COMM_WORLD, &rq[q++]);
            }
            for (int w = 0; w < W; w++) {
                unsigned char *sb = s + (size_t)(peer * W + w) * n;
                fill(sb, n, rank, w + l * 100);
                MPI_Isend(sb, (int)n, MPI_BYTE, peer, 500 + w, MPI_COMM_WORLD, &rq[q++]);
            }
        }
        /* Test until done, then wait for the rest. */
        int done = 0;
        for (int spin = 0; spin < 1000 && !done; spin++) MPI_Testall(q, rq, &done, MPI_STATUSES_IGNORE);
        MPI_Waitall(q, rq, MPI_STATUSES_IGNORE);
        for (int peer = 0; peer < size; peer++) {
            if (peer == rank) continue;
            for (int w = 0; w < W; w++) {
                unsigned char *rb = r + (size_t)(peer * W + w) * n;
                CHECK(first_bad(rb, n, peer, w + l * 100) == n, "window %d from %d size %zu", w, peer, n);
            }
        }
        free(s);
        free(r);
    }
    /* A receive nobody matches can be canceled. */
    int dummy;
    MPI_Request c;
    MPI_Status st;
    int canceled = 0;
    MPI_Irecv(&dummy, 1, MPI_INT, MPI_ANY_SOURCE, 7777, MPI_COMM_WORLD, &c);
    MPI_Cancel(&c);
    MPI_Wait(&c, &st);
    MPI_Test_cancelled(&st, &canceled);
    CHECK(canceled, "receive was not canceled");
    /* Any-source any-tag receives get everyone's message. */
    if (rank == 0) {
        int seen = 0;
        for (int i = 1; i < size; i++) {
            int v;
            MPI_Recv(&v, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
            CHECK(v == st.MPI_SOURCE * 10 && st.MPI_TAG == st.MPI_SOURCE, "any-source value %d from %d", v, st.MPI_SOURCE);
            seen |= 1 << st.MPI_SOURCE;
        }
        CHECK(seen == ((1 << size) - 2), "any-source saw mask %#x", seen);
    } else {
        int v = rank * 10;
        MPI_Send(&v, 1, MPI_INT, 0, rank, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void collectives(void) {
    for (int n = 1; n <= (1 << 18); n *= 8) {
        double *a = malloc(sizeof(double) * n), *b = malloc(sizeof(double) * n);
        for (int i = 0; i < n; i++) a[i] = rank + i;
        MPI_Allreduce(a, b, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        for (int i = 0; i < n; i++) {
            double want = (double)size * (size - 1) / 2 + (double)size * i;
            CHECK(b[i] == want, "allreduce n=%d [%d] = %f, want %f", n, i, b[i], want);
        }
        MPI_Reduce(a, b, n, MPI_DOUBLE, MPI_MAX, size - 1, MPI_COMM_WORLD);
        if (rank == size - 1)
            for (int i = 0; i < n; i++) CHECK(b[i] == size - 1 + i, "reduce max n=%d", n);
        if (rank == 0)
            for (int i = 0; i < n; i++) a[i] = 3.0 * i;
        MPI_Bcast(a, n, MPI_DOUBLE, 0, MPI_COMM_WORLD);
        for (int i = 0; i < n; i++) CHECK(a[i] == 3.0 * i, "bcast n=%d", n);
        free(a);
        free(b);
    }
    int *all = malloc(sizeof(int) * size * 64), *mine = malloc(sizeof(int) * 64 * size);
    for (int i = 0; i < 64; i++) mine[i] = rank * 1000 + i;
    MPI_Allgather(mine, 64, MPI_INT, all, 64, MPI_INT, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++)
        for (int i = 0; i < 64; i++) CHECK(all[r * 64 + i] == r * 1000 + i, "allgather");
    for (int r = 0; r < size; r++)
        for (int i = 0; i < 64; i++) mine[r * 64 + i] = rank * 100000 + r * 100 + i;
    MPI_Alltoall(mine, 64, MPI_INT, all, 64, MPI_INT, MPI_COMM_WORLD);
    for (int r = 0; r < size; r++)
        for (int i = 0; i < 64; i++)
            CHECK(all[r * 64 + i] == r * 100000 + rank * 100 + i, "alltoall from %d", r);
    MPI_Gather(mine, 64, MPI_INT, all, 64, MPI_INT, 0, MPI_COMM_WORLD);
    if (rank == 0)
        for (int r = 0; r < size; r++) CHECK(all[r * 64] == r * 100000, "gather from %d", r);
    MPI_Scatter(all, 64, MPI_INT, mine, 64, MPI_INT, 0, MPI_COMM_WORLD);
    int counts[64];
    for (int r = 0; r < size; r++) counts[r] = 64;
    for (int i = 0; i < 64 * size; i++) mine[i] = i;
    MPI_Reduce_scatter(mine, all, counts, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < 64; i++) CHECK(all[i] == size * (rank * 64 + i), "reduce_scatter");
    int v = rank + 1, scan;
    MPI_Scan(&v, &scan, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(scan == (rank + 1) * (rank + 2) / 2, "scan");
    MPI_Barrier(MPI_COMM_WORLD);
    free(all);
    free(mine);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ring_pt2pt();
    probes();
    nonblocking();
    collectives();
    long total = 0;
    MPI_Reduce(&checks, &total, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) printf("mpi_check (%d ranks): %ld passed, 0 failed\n", size, total);
    MPI_Finalize();
    return 0;
}
