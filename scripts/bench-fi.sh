#!/usr/bin/env bash
# Open MPI over the metaroce libfabric provider (pml cm + mtl ofi) against
# Open MPI over its own TCP transport (pml ob1 + btl tcp, no shared memory),
# two ranks on this machine, interleaved round by round; prints every run
# and the medians. Each round runs crates/fi/tests/mpi/mpi_bench.c (mean
# latency of 8 B and 4 KiB ping-pongs, bandwidth of 64 KiB and 1 MiB
# windows) and mpi_lat_dist.c (p50 and p90 of 20,000 8-byte round trips,
# halved).
# Usage: [BASE=DIR] scripts/bench-fi.sh [rounds]   (default 5)
# BASE: a directory holding another build's libmetaroce_fi.so, run in every
# round beside this one (order alternating by round), for before/after.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
cargo build --release -p metaroce-fi >/dev/null
out=$(mktemp -d)
mpicc -O2 -o "$out/mpi_bench" crates/fi/tests/mpi/mpi_bench.c
mpicc -O2 -o "$out/mpi_lat_dist" crates/fi/tests/mpi/mpi_lat_dist.c
common=(--allow-run-as-root --oversubscribe -np 2 --bind-to none)
ofi=(--mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include metaroce --mca btl self,vader,tcp)
tcp=(--mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include lo)
builds=(metaroce)
[ -n "${BASE:-}" ] && builds+=(base)
provider() {
  local dir=$PWD/target/release
  [ "$1" = base ] && dir=$BASE
  for prog in mpi_bench "mpi_lat_dist 8 20000"; do
    FI_PROVIDER_PATH=$dir mpirun "${common[@]}" "${ofi[@]}" -x FI_PROVIDER_PATH \
      $out/$prog 2>/dev/null | sed "s/^/$1 /" | tee -a "$out/all"
  done
}
for r in $(seq "$rounds"); do
  order=("${builds[@]}")
  if [ $((r % 2)) = 0 ] && [ ${#builds[@]} = 2 ]; then order=(base metaroce); fi
  for b in "${order[@]}"; do provider "$b"; done
  for prog in mpi_bench "mpi_lat_dist 8 20000"; do
    mpirun "${common[@]}" "${tcp[@]}" $out/$prog 2>/dev/null | sed "s/^/tcp /" | tee -a "$out/all"
  done
done
echo "== medians of $rounds runs"
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
for t in "${builds[@]}" tcp; do
  for m in "lat 8" "lat 4096" "bw 65536" "bw 1048576"; do
    echo "$t $m $(grep "^$t $m " "$out/all" | awk '{print $4}' | median)"
  done
  echo "$t dist 8 p50 $(grep "^$t dist 8 " "$out/all" | awk '{print $5}' | median) p90 $(grep "^$t dist 8 " "$out/all" | awk '{print $7}' | median)"
done
