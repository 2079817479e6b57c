#!/bin/sh
# All-reduce side by side, interleaved: MetaRoCE's coll-perf, Open MPI's
# MPI_Allreduce over its TCP BTL (tools/mpi-allreduce-bench.c) and the raw
# UDP ceiling (metaroce perf udp-bw --loopback), ROUNDS rounds, each round
# every world size of every contender in turn, so that a noisy neighbour
# hits them all alike. Writes raw outputs to OUT and prints medians.
#
# usage: [LARGE=0] [WORLDS="2 4 8"] scripts/bench-allreduce.sh [ROUNDS] [OUT]
# LARGE=0 skips 64 MiB and 256 MiB.
# needs: cargo build --release -p metaroce; scripts/build-mpi-bench.sh
set -u
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
OUT=${2:-target/bench-allreduce}
BIN=target/release/metaroce
MPI=target/mpi-allreduce-bench
mkdir -p "$OUT"
rm -f "$OUT"/*.txt "$OUT"/*.json
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl tcp,self --mca btl_tcp_if_include lo"
for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round" >&2
  $BIN perf udp-bw --loopback > "$OUT/udp-r$round.txt" 2>&1
  for n in ${WORLDS:-2 4 8}; do
    $BIN coll-perf all_reduce --ranks $n -b 8 -e 8 -n 200 -w 20 -c 0 \
      --json "$OUT/mr-lat-n$n-r$round.json" > /dev/null
    $MPIRUN -np $n $MPI 8 8 2 200 > "$OUT/mpi-lat-n$n-r$round.txt"
    $BIN coll-perf all_reduce --ranks $n -b 1M -e 16M -f 4 -n 5 -w 1 -c 0 \
      --json "$OUT/mr-small-n$n-r$round.json" > /dev/null
    $MPIRUN -np $n $MPI 1048576 16777216 4 5 > "$OUT/mpi-small-n$n-r$round.txt"
    if [ "${LARGE:-1}" != 0 ]; then
      $BIN coll-perf all_reduce --ranks $n -b 64M -e 256M -f 4 -n 3 -w 1 -c 0 \
        --json "$OUT/mr-large-n$n-r$round.json" > /dev/null
      $MPIRUN -np $n $MPI 67108864 268435456 4 3 > "$OUT/mpi-large-n$n-r$round.txt"
    fi
  done
done
python3 - "$OUT" <<'PY'
import glob, json, re, statistics, sys
out = sys.argv[1]
res = {}  # (who, n, size) -> [(time_us, busbw)]
for f in glob.glob(f"{out}/mr-*.json"):
    n = int(re.search(r"-n(\d+)-", f).group(1))
    for r in json.load(open(f))["results"]:
        m = r["out_of_place"]
        res.setdefault(("metaroce", n, r["size"]), []).append((m["time_us"], m["busbw_gbps"]))
for f in glob.glob(f"{out}/mpi-*.txt"):
    n = int(re.search(r"-n(\d+)-", f).group(1))
    for line in open(f):
        p = line.split()
        if len(p) == 4 and not line.startswith("#"):
            res.setdefault(("openmpi-tcp", n, int(p[0])), []).append((float(p[1]), float(p[3])))
udp = []
for f in glob.glob(f"{out}/udp-*.txt"):
    for line in open(f):
        p = line.split()
        if len(p) == 5 and p[0] == "65536":
            udp.append(float(p[3]) * 1048576 / 1e9)
med = lambda xs: statistics.median(xs)
print(f"raw UDP ceiling (udp-bw --loopback, one flow): median {med(udp):.2f} GB/s over {len(udp)} rounds")
print(f"{'size':>10} {'ranks':>5} {'MetaRoCE busbw':>15} {'Open MPI busbw':>15} {'MetaRoCE us':>12} {'Open MPI us':>12}  rounds")
sizes = sorted({k[2] for k in res})
for n in (2, 4, 8):
    for s in sizes:
        a, b = res.get(("metaroce", n, s), []), res.get(("openmpi-tcp", n, s), [])
        if not a or not b:
            continue
        print(f"{s:>10} {n:>5} {med([x[1] for x in a]):>15.3f} {med([x[1] for x in b]):>15.3f} "
              f"{med([x[0] for x in a]):>12.1f} {med([x[0] for x in b]):>12.1f}  {len(a)}/{len(b)}")
PY
