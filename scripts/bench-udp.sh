#!/usr/bin/env bash
# The UDP datapath benchmark table of BENCHMARKS.md: MetaRoCE write-bw /
# read-bw / write-lat / send-lat on loopback against the kernel's UDP path
# (metaroce perf udp-bw / udp-lat), a TCP stream (iperf3) and libfabric's
# reliable-datagram provider over UDP (fi_pingpong -p "udp;ofi_rxd"), all
# interleaved round by round so a drifting machine moves every column
# alike; prints the median of ROUNDS runs of each. write-bw and read-bw
# rewrite perftest's one-message buffer, as iperf3 and udp-bw rewrite
# theirs; the "64 MiB buffer" column cycles write-bw through 64 MiB per
# side instead (--buffer-bytes), cold caches.
#
#   cargo build --release -p metaroce
#   scripts/bench-udp.sh [ROUNDS] [SECONDS]      # defaults: 5 rounds, 3 s
#
# iperf3 and fi_pingpong are optional (Debian: iperf3, libfabric-bin);
# their columns read "n/a" where missing.
set -u
ROUNDS=${1:-5}
SECS=${2:-3}
BIN=${METAROCE_BIN:-target/release/metaroce}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# A side-channel port of our own: another perf run on the machine (the
# default 18515) would make a run fail.
PORT=$((30000 + RANDOM % 20000))

# Column 4 of the perftest-style row = BW average; column 5 of a latency
# row = t_typical (median). $1 is the size the row starts with.
bw() { "$BIN" perf "$1" --loopback -p "$PORT" -s "$2" -D "$SECS" --report_gbits "${@:3}" 2>/dev/null | awk -v s="$2" '$1==s && NF>=5 {print $4}'; }
lat() { "$BIN" perf "$1" --loopback -p "$PORT" -s "$2" -n 20000 2>/dev/null | awk -v s="$2" '$1==s && NF>=8 {print $5}'; }
iperf() {
    command -v iperf3 >/dev/null || return
    local port=$((PORT + 1))
    iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
    local srv=$!
    sleep 0.3
    iperf3 -c 127.0.0.1 -p "$port" -t "$SECS" -f g 2>/dev/null | awk '/receiver/ {print $7}'
    wait "$srv" 2>/dev/null
}
# fi_pingpong: ping-pong of one message at a time; MB/s (10^6 B) -> Gb/s,
# and usec/xfer is a round trip's half (it times send + matching receive).
fabric() {
    command -v fi_pingpong >/dev/null || return
    local port=$((20000 + RANDOM % 20000))
    timeout 60 fi_pingpong -p "udp;ofi_rxd" -e rdm -B "$port" -S "$1" -I "$2" >/dev/null 2>&1 &
    local srv=$!
    sleep 0.5
    timeout 60 fi_pingpong -p "udp;ofi_rxd" -e rdm -P "$port" -S "$1" -I "$2" 127.0.0.1 2>/dev/null |
        awk -v what="$3" 'NR>1 && NF>=8 {print (what=="bw") ? $6*8/1000 : $7}'
    wait "$srv" 2>/dev/null
}

rec() { local v; v=$("${@:2}"); echo "${v:-n/a}" >>"$OUT/$1"; }

for r in $(seq "$ROUNDS"); do
    echo "round $r/$ROUNDS" >&2
    for s in 4096 65536 1048576; do
        rec "write-bw-$s" bw write-bw "$s"
        rec "write-bw-icrc-$s" bw write-bw "$s" --icrc
        rec "write-bw-cold-$s" bw write-bw "$s" --buffer-bytes 67108864
        rec "read-bw-$s" bw read-bw "$s"
        rec "udp-bw-$s" bw udp-bw "$s"
        rec "fi-bw-$s" fabric "$s" $((s > 65536 ? 300 : 2000)) bw
    done
    rec iperf3 iperf
    for s in 8 4096; do
        rec "write-lat-$s" lat write-lat "$s"
        rec "send-lat-$s" lat send-lat "$s"
        rec "udp-lat-$s" lat udp-lat "$s"
        rec "fi-lat-$s" fabric "$s" 20000 lat
    done
done

median() {
    [ -f "$OUT/$1" ] || { echo n/a; return; }
    grep -v n/a "$OUT/$1" | sort -g | awk '{v[NR]=$1} END {if (NR==0) print "n/a"; else if (NR%2) print v[(NR+1)/2]; else printf "%.2f\n", (v[NR/2]+v[NR/2+1])/2}'
}
runs() { [ -f "$OUT/$1" ] && paste -sd' ' "$OUT/$1" || echo n/a; }

echo
echo "Bandwidth, Gb/s (BW average; medians of $ROUNDS, ${SECS}s runs)"
echo "| size | write-bw | write-bw --icrc | write-bw, 64 MiB buffer | read-bw | udp-bw | write-bw / udp-bw | read-bw / udp-bw | iperf3 TCP | write-bw / iperf3 | read-bw / iperf3 | fi_pingpong udp;ofi_rxd |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for s in 4096 65536 1048576; do
    w=$(median "write-bw-$s"); rd=$(median "read-bw-$s"); u=$(median "udp-bw-$s"); t=$(median iperf3)
    pct() { awk -v a="$1" -v b="$2" 'BEGIN {if (a+0>0 && b+0>0) printf "%.0f %%", 100*a/b; else print "n/a"}'; }
    times() { awk -v a="$1" -v b="$2" 'BEGIN {if (a+0>0 && b+0>0) printf "%.2f x", a/b; else print "n/a"}'; }
    echo "| $s | $w | $(median "write-bw-icrc-$s") | $(median "write-bw-cold-$s") | $rd | $u | $(pct "$w" "$u") | $(pct "$rd" "$u") | $t | $(times "$w" "$t") | $(times "$rd" "$t") | $(median "fi-bw-$s") |"
done
echo
echo "Latency, one-way us (t_typical = median of the run; medians of $ROUNDS runs)"
echo "| size | write-lat | send-lat | udp-lat | write-lat / udp-lat | fi_pingpong udp;ofi_rxd |"
echo "| --- | --- | --- | --- | --- | --- |"
for s in 8 4096; do
    w=$(median "write-lat-$s"); u=$(median "udp-lat-$s")
    ratio=$(awk -v w="$w" -v u="$u" 'BEGIN {if (u+0>0 && w+0>0) printf "%.2f x", w/u; else print "n/a"}')
    echo "| $s | $w | $(median "send-lat-$s") | $u | $ratio | $(median "fi-lat-$s") |"
done
echo
echo "All runs:"
for f in "$OUT"/*; do echo "  $(basename "$f"): $(runs "$(basename "$f")")"; done
