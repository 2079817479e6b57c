#!/bin/sh
# Builds tools/mpi-allreduce-bench.c into target/mpi-allreduce-bench with
# Debian's Open MPI (apt-get install openmpi-bin libopenmpi-dev), and
# tools/gloo-allreduce-bench.cc into target/gloo-allreduce-bench when
# Debian's Gloo is there (apt-get install libgloo-dev g++).
set -eu
cd "$(dirname "$0")/.."
command -v mpicc >/dev/null || {
    echo "mpicc not found: apt-get install openmpi-bin libopenmpi-dev" >&2
    exit 1
}
mkdir -p target
mpicc -O2 -o target/mpi-allreduce-bench tools/mpi-allreduce-bench.c
echo target/mpi-allreduce-bench
if [ -f /usr/include/gloo/allreduce.h ] && command -v g++ >/dev/null; then
    g++ -O2 -std=c++17 -o target/gloo-allreduce-bench tools/gloo-allreduce-bench.cc -lgloo -lpthread
    echo target/gloo-allreduce-bench
else
    echo "Gloo not built (apt-get install libgloo-dev g++ for target/gloo-allreduce-bench)" >&2
fi
