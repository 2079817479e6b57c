/* MPI_Allreduce timing in nccl-tests' terms, for comparing MetaRoCE's
 * `metaroce coll-perf all_reduce` with Open MPI over its TCP transport.
 *
 * usage: mpirun -np N ./mpi-allreduce-bench MIN_BYTES MAX_BYTES FACTOR ITERS [WARMUP]
 *
 * For each size (float, sum, out of place): WARMUP warm-up calls (default
 * 1; scripts/bench-allreduce.sh gives 5 where coll-perf runs -w 5), a barrier,
 * ITERS timed calls, the per-call time averaged over ranks (nccl-tests'
 * -a 1), algbw = size / time and busbw = algbw * 2(n-1)/n, one line per
 * size on rank 0: "size time_us algbw_GBps busbw_GBps". Built by
 * scripts/build-mpi-bench.sh. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (argc != 5 && argc != 6) {
        if (rank == 0)
            fprintf(stderr, "usage: %s MIN_BYTES MAX_BYTES FACTOR ITERS [WARMUP]\n", argv[0]);
        MPI_Finalize();
        return 2;
    }
    long min = atol(argv[1]), max = atol(argv[2]), factor = atol(argv[3]);
    int iters = atoi(argv[4]);
    int warmup = argc == 6 ? atoi(argv[5]) : 1;
    if (min < 4 || max < min || factor < 2 || iters < 1 || warmup < 0) {
        if (rank == 0)
            fprintf(stderr, "need 4 <= MIN <= MAX, FACTOR >= 2, ITERS >= 1, WARMUP >= 0\n");
        MPI_Finalize();
        return 2;
    }
    float *send = malloc(max), *recv = malloc(max);
    if (!send || !recv) {
        fprintf(stderr, "out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (long i = 0; i < max / 4; i++)
        send[i] = (float)(i % 17);
    if (rank == 0)
        printf("# MPI_Allreduce float sum, %d ranks\n# size_B time_us algbw_GBps busbw_GBps\n", world);
    for (long size = min; size <= max; size *= factor) {
        int count = (int)(size / 4);
        for (int i = 0; i < warmup; i++)
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++)
            MPI_Allreduce(send, recv, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double mine = (MPI_Wtime() - t0) / iters, sum = 0;
        MPI_Allreduce(&mine, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        double t = sum / world;
        double alg = (double)size / 1e9 / t;
        if (rank == 0)
            printf("%12ld %10.2f %8.3f %8.3f\n", size, t * 1e6, alg,
                   alg * 2.0 * (world - 1) / world);
        fflush(stdout);
    }
    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
