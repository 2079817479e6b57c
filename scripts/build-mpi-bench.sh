#!/bin/sh
# Builds tools/mpi-allreduce-bench.c into target/mpi-allreduce-bench with
# Debian's Open MPI (apt-get install openmpi-bin libopenmpi-dev).
set -eu
cd "$(dirname "$0")/.."
command -v mpicc >/dev/null || {
    echo "mpicc not found: apt-get install openmpi-bin libopenmpi-dev" >&2
    exit 1
}
mkdir -p target
mpicc -O2 -o target/mpi-allreduce-bench tools/mpi-allreduce-bench.c
echo target/mpi-allreduce-bench
