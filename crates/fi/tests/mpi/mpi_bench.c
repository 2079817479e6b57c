/*
 * Latency and bandwidth between ranks 0 and 1, the osu_latency /
 * osu_bw way: latency is half the round trip of a ping-pong of SIZE bytes;
 * bandwidth is a window of 64 non-blocking sends of SIZE bytes answered by
 * one small ack, repeated. Prints one line per measurement:
 *   lat <bytes> <usec>     bw <bytes> <Gbit/s>
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank;

static void latency(size_t n, int iters) {
    char *b = malloc(n + 1);
    memset(b, 1, n);
    for (int phase = 0; phase < 2; phase++) {
        int it = phase ? iters : iters / 10;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < it; i++) {
            if (rank == 0) {
                MPI_Send(b, (int)n, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
                MPI_Recv(b, (int)n, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(b, (int)n, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(b, (int)n, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
            }
        }
        double t = MPI_Wtime() - t0;
        if (phase && rank == 0) printf("lat %zu %.2f\n", n, t * 1e6 / it / 2);
    }
    free(b);
}

static void bandwidth(size_t n, int iters) {
    enum { W = 64 };
    char *b = malloc(n * W);
    memset(b, 2, n * W);
    MPI_Request rq[W];
    for (int phase = 0; phase < 2; phase++) {
        int it = phase ? iters : 2;
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < it; i++) {
            char ack;
            if (rank == 0) {
                for (int w = 0; w < W; w++) MPI_Isend(b + w * n, (int)n, MPI_BYTE, 1, 2, MPI_COMM_WORLD, &rq[w]);
                MPI_Waitall(W, rq, MPI_STATUSES_IGNORE);
                MPI_Recv(&ack, 1, MPI_BYTE, 1, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                for (int w = 0; w < W; w++) MPI_Irecv(b + w * n, (int)n, MPI_BYTE, 0, 2, MPI_COMM_WORLD, &rq[w]);
                MPI_Waitall(W, rq, MPI_STATUSES_IGNORE);
                MPI_Send(&ack, 1, MPI_BYTE, 0, 3, MPI_COMM_WORLD);
            }
        }
        double t = MPI_Wtime() - t0;
        if (phase && rank == 0) printf("bw %zu %.2f\n", n, (double)n * W * it * 8 / t / 1e9);
    }
    free(b);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    latency(8, 5000);
    latency(4096, 2000);
    bandwidth(65536, 20);
    bandwidth(1 << 20, 5);
    MPI_Finalize();
    return 0;
}
