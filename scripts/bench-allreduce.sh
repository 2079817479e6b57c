#!/bin/sh
# All-reduce side by side, interleaved: MetaRoCE's coll-perf, Open MPI's
# MPI_Allreduce over its TCP BTL (tools/mpi-allreduce-bench.c), Gloo's
# allreduce over its TCP transport (tools/gloo-allreduce-bench.cc, when
# scripts/build-mpi-bench.sh could build it) and the raw
# UDP ceiling (metaroce perf udp-bw --loopback), ROUNDS rounds, each round
# every world size of every contender in turn, so that a noisy neighbour
# hits them all alike. Writes raw outputs to OUT and prints medians.
# MetaRoCE runs twice per size: with nccl-tests' default buffers, and with
# symmetric receive buffers (-R 2, as an NCCL job registers its buffers:
# peers write the all-gather's blocks straight into them, see
# docs/collectives.md, "Symmetric buffers"); the table shows both.
#
# usage: [LARGE=0] [WORLDS="2 4 8"] [BASE=other-metaroce] scripts/bench-allreduce.sh [ROUNDS] [OUT]
# LARGE=0 skips 64 MiB and 256 MiB. BASE: a second metaroce binary (an
# earlier build) run in each round right after this one, as a fourth
# contender ("base"), for before/after comparisons under the same load.
# 1-16 MiB run 20 timed iterations after 5 warm-up ones (nccl-tests'
# defaults; 5 and 1 until collectives round 14: the first operations of a
# job on an oversubscribed host are slower, see docs/collectives.md, and 1
# MiB, the first size, was measured on them alone); Open MPI times 20
# after 5 warm-up calls too, Gloo 20 after its single warm-up call.
# needs: cargo build --release -p metaroce; scripts/build-mpi-bench.sh
set -u
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
OUT=${2:-target/bench-allreduce}
BIN=target/release/metaroce
MPI=target/mpi-allreduce-bench
GLOO=target/gloo-allreduce-bench
# gloo RANKS MIN MAX FACTOR ITERS OUTFILE: WORLD ranks on 127.0.0.1.
gloo() {
  [ -x "$GLOO" ] || return 0
  store=$(mktemp -d)
  for r in $(seq 0 $(($1 - 1))); do
    if [ "$r" = 0 ]; then
      "$GLOO" 0 "$1" "$store" "$2" "$3" "$4" "$5" > "$6" &
    else
      "$GLOO" "$r" "$1" "$store" "$2" "$3" "$4" "$5" > /dev/null &
    fi
  done
  wait
  rm -rf "$store"
}
mkdir -p "$OUT"
rm -f "$OUT"/*.txt "$OUT"/*.json
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl tcp,self --mca btl_tcp_if_include lo"
for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round" >&2
  $BIN perf udp-bw --loopback > "$OUT/udp-r$round.txt" 2>&1
  for n in ${WORLDS:-2 4 8}; do
    $BIN coll-perf all_reduce --ranks $n -b 8 -e 8 -n 200 -w 20 -c 0 \
      --json "$OUT/mr-lat-n$n-r$round.json" > /dev/null
    [ -n "${BASE:-}" ] && $BASE coll-perf all_reduce --ranks $n -b 8 -e 8 -n 200 -w 20 -c 0 \
      --json "$OUT/base-lat-n$n-r$round.json" > /dev/null
    $MPIRUN -np $n $MPI 8 8 2 200 > "$OUT/mpi-lat-n$n-r$round.txt"
    gloo $n 8 8 2 200 "$OUT/gloo-lat-n$n-r$round.txt"
    $BIN coll-perf all_reduce --ranks $n -b 1M -e 16M -f 4 -n 20 -w 5 -c 0 \
      --json "$OUT/mr-small-n$n-r$round.json" > /dev/null
    $BIN coll-perf all_reduce --ranks $n -b 1M -e 16M -f 4 -n 20 -w 5 -c 0 -R 2 \
      --json "$OUT/sym-small-n$n-r$round.json" > /dev/null
    [ -n "${BASE:-}" ] && $BASE coll-perf all_reduce --ranks $n -b 1M -e 16M -f 4 -n 20 -w 5 -c 0 \
      --json "$OUT/base-small-n$n-r$round.json" > /dev/null
    $MPIRUN -np $n $MPI 1048576 16777216 4 20 5 > "$OUT/mpi-small-n$n-r$round.txt"
    gloo $n 1048576 16777216 4 20 "$OUT/gloo-small-n$n-r$round.txt"
    if [ "${LARGE:-1}" != 0 ]; then
      $BIN coll-perf all_reduce --ranks $n -b 64M -e 256M -f 4 -n 3 -w 1 -c 0 \
        --json "$OUT/mr-large-n$n-r$round.json" > /dev/null
      $BIN coll-perf all_reduce --ranks $n -b 64M -e 256M -f 4 -n 3 -w 1 -c 0 -R 2 \
        --json "$OUT/sym-large-n$n-r$round.json" > /dev/null
      $MPIRUN -np $n $MPI 67108864 268435456 4 3 > "$OUT/mpi-large-n$n-r$round.txt"
      gloo $n 67108864 268435456 4 3 "$OUT/gloo-large-n$n-r$round.txt"
    fi
  done
done
python3 - "$OUT" <<'PY'
import glob, json, re, statistics, sys
out = sys.argv[1]
res = {}  # (who, n, size) -> [(time_us, busbw)]
for who, pat in (("metaroce", "mr"), ("symmetric", "sym"), ("base", "base")):
    for f in glob.glob(f"{out}/{pat}-*.json"):
        n = int(re.search(r"-n(\d+)-", f).group(1))
        for r in json.load(open(f))["results"]:
            m = r["out_of_place"]
            res.setdefault((who, n, r["size"]), []).append((m["time_us"], m["busbw_gbps"]))
for who, pat in (("openmpi-tcp", "mpi"), ("gloo-tcp", "gloo")):
    for f in glob.glob(f"{out}/{pat}-*.txt"):
        n = int(re.search(r"-n(\d+)-", f).group(1))
        for line in open(f):
            p = line.split()
            if len(p) == 4 and not line.startswith("#"):
                res.setdefault((who, n, int(p[0])), []).append((float(p[1]), float(p[3])))
udp = []
for f in glob.glob(f"{out}/udp-*.txt"):
    for line in open(f):
        p = line.split()
        if len(p) == 5 and p[0] == "65536":
            udp.append(float(p[3]) * 1048576 / 1e9)
med = lambda xs: statistics.median(xs)
print(f"raw UDP ceiling (udp-bw --loopback, one flow): median {med(udp):.2f} GB/s over {len(udp)} rounds")
print(f"{'size':>10} {'ranks':>5} {'MetaRoCE busbw':>15} {'-R 2 busbw':>11} {'Open MPI busbw':>15} {'Gloo busbw':>11} "
      f"{'MetaRoCE us':>12} {'-R 2 us':>9} {'Open MPI us':>12} {'Gloo us':>10}  rounds")
sizes = sorted({k[2] for k in res})
for n in (2, 4, 8):
    for s in sizes:
        a, b = res.get(("metaroce", n, s), []), res.get(("openmpi-tcp", n, s), [])
        g = res.get(("gloo-tcp", n, s), [])
        y = res.get(("symmetric", n, s), [])
        if not a or not b:
            continue
        gb = f"{med([x[1] for x in g]):>11.3f}" if g else f"{'-':>11}"
        gt = f"{med([x[0] for x in g]):>10.1f}" if g else f"{'-':>10}"
        yb = f"{med([x[1] for x in y]):>11.3f}" if y else f"{'-':>11}"
        yt = f"{med([x[0] for x in y]):>9.1f}" if y else f"{'-':>9}"
        print(f"{s:>10} {n:>5} {med([x[1] for x in a]):>15.3f} {yb} {med([x[1] for x in b]):>15.3f} {gb} "
              f"{med([x[0] for x in a]):>12.1f} {yt} {med([x[0] for x in b]):>12.1f} {gt}  {len(a)}/{len(y)}/{len(b)}/{len(g)}")
base = [k for k in res if k[0] == "base"]
if base:
    print("base (BASE binary) against this build, same rounds:")
    print(f"{'size':>10} {'ranks':>5} {'base busbw':>11} {'this busbw':>11} {'base us':>10} {'this us':>10}  sorted busbw base / this")
    for n in (2, 4, 8):
        for s in sizes:
            a, c = res.get(("metaroce", n, s), []), res.get(("base", n, s), [])
            if not a or not c:
                continue
            srt = lambda xs: " ".join(f"{x[1]:.3f}" if s > 8 else f"{x[0]:.0f}" for x in sorted(xs, key=lambda x: x[1] if s > 8 else x[0]))
            print(f"{s:>10} {n:>5} {med([x[1] for x in c]):>11.3f} {med([x[1] for x in a]):>11.3f} "
                  f"{med([x[0] for x in c]):>10.1f} {med([x[0] for x in a]):>10.1f}  {srt(c)} / {srt(a)}")
PY
