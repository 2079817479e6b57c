/* The MPI test programs' check: count it, and on failure name the rank,
 * the line and what was wrong, then abort the whole job (a failed rank
 * must not leave the others waiting). Each program sets `rank` and `size`
 * after MPI_Init and prints `checks` at the end. */
#ifndef METAROCE_MPI_CHECK_H
#define METAROCE_MPI_CHECK_H

#include <mpi.h>
#include <stdio.h>

static int rank, size;
static long checks;

#define CHECK(cond, ...)                                                     \
    do {                                                                     \
        checks++;                                                            \
        if (!(cond)) {                                                       \
            fprintf(stderr, "rank %d: FAILED %s:%d: ", rank, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                    \
            fprintf(stderr, "\n");                                           \
            MPI_Abort(MPI_COMM_WORLD, 1);                                    \
        }                                                                    \
    } while (0)

#endif
