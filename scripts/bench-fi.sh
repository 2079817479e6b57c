#!/usr/bin/env bash
# Open MPI over the metaroce libfabric provider (pml cm + mtl ofi) against
# Open MPI over its own TCP transport (pml ob1 + btl tcp, no shared memory),
# two ranks on this machine, interleaved round by round; prints every run
# and the medians. Usage: scripts/bench-fi.sh [rounds]   (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
cargo build --release -p metaroce-fi >/dev/null
out=$(mktemp -d)
mpicc -O2 -o "$out/mpi_bench" crates/fi/tests/mpi/mpi_bench.c
common=(--allow-run-as-root --oversubscribe -np 2 --bind-to none)
for r in $(seq "$rounds"); do
  FI_PROVIDER_PATH=$PWD/target/release mpirun "${common[@]}" \
    --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include metaroce --mca btl self,vader,tcp \
    -x FI_PROVIDER_PATH "$out/mpi_bench" 2>/dev/null | sed "s/^/metaroce /" | tee -a "$out/all"
  mpirun "${common[@]}" --mca pml ob1 --mca btl self,tcp \
    --mca btl_tcp_if_include lo "$out/mpi_bench" 2>/dev/null | sed "s/^/tcp /" | tee -a "$out/all"
done
echo "== medians of $rounds runs"
for t in metaroce tcp; do
  for m in "lat 8" "lat 4096" "bw 65536" "bw 1048576"; do
    v=$(grep "^$t $m " "$out/all" | awk '{print $4}' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    echo "$t $m $v"
  done
done
