/*
 * Per-message latency between ranks 0 and 1: an 8-byte ping-pong (size
 * from argv[1], iterations from argv[2]) where rank 0 times every round
 * trip on its own, after a tenth as many warm-up round trips. Prints
 * half-round-trip percentiles in microseconds:
 *   dist <bytes> p50 <us> p90 <us> p99 <us> max <us>
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    size_t n = argc > 1 ? (size_t)atol(argv[1]) : 8;
    int iters = argc > 2 ? atoi(argv[2]) : 20000;
    char *b = malloc(n + 1);
    double *t = malloc(sizeof(double) * (size_t)iters);
    memset(b, 3, n);
    for (int phase = 0; phase < 2; phase++) {
        int it = phase ? iters : iters / 10;
        MPI_Barrier(MPI_COMM_WORLD);
        for (int i = 0; i < it; i++) {
            if (rank == 0) {
                double t0 = MPI_Wtime();
                MPI_Send(b, (int)n, MPI_BYTE, 1, 7, MPI_COMM_WORLD);
                MPI_Recv(b, (int)n, MPI_BYTE, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (phase) t[i] = (MPI_Wtime() - t0) * 1e6 / 2;
            } else {
                MPI_Recv(b, (int)n, MPI_BYTE, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(b, (int)n, MPI_BYTE, 0, 7, MPI_COMM_WORLD);
            }
        }
    }
    if (rank == 0) {
        qsort(t, (size_t)iters, sizeof(double), by_value);
        printf("dist %zu p50 %.2f p90 %.2f p99 %.2f max %.2f\n", n, t[iters / 2],
               t[iters * 9 / 10], t[iters * 99 / 100], t[iters - 1]);
    }
    free(t);
    free(b);
    MPI_Finalize();
    return 0;
}
