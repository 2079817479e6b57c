#!/usr/bin/env bash
# MetaRoCE under adverse conditions on loopback, each beside its baseline in
# the same round (interleaved, medians of ROUNDS runs of SECONDS each):
#
# - loss: write-bw 64 KiB with --impair loss=0.01 / 0.05 (every datagram
#   at both receivers, data and ACKs) against loss-free;
# - a CPU hog: one busy loop pinned to vCPU 0 for the length of a run,
#   write-bw 64 KiB and one iperf3 TCP stream each with and without it;
#   the figure is how much of its own hog-free bandwidth each keeps;
# - the same hog against MetaRoCE held to TCP's rate: write-bw with
#   --rate_limit set to the rate iperf3 reached in the same round, with and
#   without the hog (an equal offered load: a stream that needs every
#   cycle of both vCPUs loses to any hog, one that needs fewer need not).
#
#   cargo build --release -p metaroce
#   scripts/bench-udp-adverse.sh [ROUNDS] [SECONDS]   # defaults: 5 rounds, 3 s
set -u
ROUNDS=${1:-5}
SECS=${2:-3}
BIN=${METAROCE_BIN:-target/release/metaroce}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"; [ -n "${HOG:-}" ] && kill "$HOG" 2>/dev/null' EXIT
PORT=$((30000 + RANDOM % 20000))

bw() { "$BIN" perf write-bw --loopback -p "$PORT" -s 65536 -D "$SECS" --report_gbits "$@" 2>/dev/null | awk '$1==65536 && NF>=5 {print $4}'; }
iperf() {
    command -v iperf3 >/dev/null || return
    iperf3 -s -1 -p $((PORT + 1)) >/dev/null 2>&1 &
    local srv=$!
    sleep 0.3
    iperf3 -c 127.0.0.1 -p $((PORT + 1)) -t "$SECS" -f g 2>/dev/null | awk '/receiver/ {print $7}'
    wait "$srv" 2>/dev/null
}
hog_on() { taskset -c 0 sh -c 'while :; do :; done' & HOG=$!; }
hog_off() { kill "$HOG" 2>/dev/null; wait "$HOG" 2>/dev/null; HOG=; }
rec() { local v; v=$("${@:2}"); echo "${v:-n/a}" >>"$OUT/$1"; }

for r in $(seq "$ROUNDS"); do
    echo "round $r/$ROUNDS" >&2
    rec loss-0 bw
    rec loss-1 bw --impair loss=0.01,seed=$r
    rec loss-5 bw --impair loss=0.05,seed=$r
    rec tcp-free iperf
    rate=$(tail -n 1 "$OUT/tcp-free")
    case "$rate" in ''|n/a) rate=20 ;; esac
    rec mr-tcprate-free bw --rate_limit "$rate"
    hog_on; rec mr-tcprate-hog bw --rate_limit "$rate"; hog_off
    hog_on; rec tcp-hog iperf; hog_off
    hog_on; rec mr-hog bw; hog_off
done

median() {
    [ -f "$OUT/$1" ] || { echo n/a; return; }
    grep -v n/a "$OUT/$1" | sort -g | awk '{v[NR]=$1} END {if (NR==0) print "n/a"; else if (NR%2) print v[(NR+1)/2]; else printf "%.2f\n", (v[NR/2]+v[NR/2+1])/2}'
}
pct() { awk -v a="$1" -v b="$2" 'BEGIN {if (a+0>0 && b+0>0) printf "%.0f %%", 100*a/b; else print "n/a"}'; }
l0=$(median loss-0) l1=$(median loss-1) l5=$(median loss-5)
echo
echo "Loss, write-bw 64 KiB, Gb/s (medians of $ROUNDS, ${SECS}s runs)"
echo "| loss | BW average | of loss-free |"
echo "| --- | --- | --- |"
echo "| 0 | $l0 | 100 % |"
echo "| 1 % | $l1 | $(pct "$l1" "$l0") |"
echo "| 5 % | $l5 | $(pct "$l5" "$l0") |"
tf=$(median tcp-free) th=$(median tcp-hog) mh=$(median mr-hog)
echo
echo "CPU hog on vCPU 0, Gb/s (medians of $ROUNDS, ${SECS}s runs)"
echo "| transport | no hog | hog | kept |"
echo "| --- | --- | --- | --- |"
echo "| MetaRoCE write-bw 64 KiB | $l0 | $mh | $(pct "$mh" "$l0") |"
echo "| iperf3 TCP, 1 stream | $tf | $th | $(pct "$th" "$tf") |"
rf=$(median mr-tcprate-free) rh=$(median mr-tcprate-hog)
echo "| MetaRoCE write-bw 64 KiB, --rate_limit = the round's TCP rate | $rf | $rh | $(pct "$rh" "$rf") |"
echo
echo "All runs:"
for f in "$OUT"/*; do echo "  $(basename "$f"): $(paste -sd' ' "$f")"; done
