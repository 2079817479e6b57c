#!/usr/bin/env bash
# The namespace fabric of crates/perf/tests/fabric, by hand, for measuring:
#
#   client (mrfc, 10.77.1.1) - r1 (mrfr1) = N links = r2 (mrfr2) - server (mrfs, 10.77.2.2)
#
# both routers with a nexthop group over the N links and the kernel's L4
# ECMP hash (fib_multipath_hash_policy=1), every link MTU bytes; an nft
# table per router with a fragment counter (chain frags) and a chain for
# blackholes (bh).
#
#   scripts/netns-fabric.sh up [LINKS] [MTU]     # default 2 links, 1500
#   scripts/netns-fabric.sh blackhole K          # silently drop link K both ways
#   scripts/netns-fabric.sh heal
#   scripts/netns-fabric.sh stats                # per-link bytes, fragments
#   scripts/netns-fabric.sh down
#   ip netns exec mrfs metaroce perf write-bw &  ip netns exec mrfc metaroce perf write-bw 10.77.2.2
set -eu
cmd=${1:-up}
C=mrfc R1=mrfr1 R2=mrfr2 S=mrfs
x() { ip netns exec "$@"; }
case $cmd in
up)
    links=${2:-2} mtu=${3:-1500}
    for n in $C $R1 $R2 $S; do
        ip netns del $n 2>/dev/null || true
        ip netns add $n
        ip -n $n link set lo up
        x $n sh -c 'echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter; echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter'
    done
    wire() { # ns_a dev_a ip_a ns_b dev_b ip_b
        ip -n "$1" link add "$2" mtu "$mtu" type veth peer name "$5" mtu "$mtu" netns "$4"
        ip -n "$1" addr add "$3" dev "$2"; ip -n "$1" link set "$2" up
        ip -n "$4" addr add "$6" dev "$5"; ip -n "$4" link set "$5" up
    }
    wire $C c0 10.77.1.1/24 $R1 r1c 10.77.1.2/24
    wire $R2 r2s 10.77.2.1/24 $S s0 10.77.2.2/24
    for k in $(seq 0 $((links - 1))); do
        wire $R1 r1l$k 10.77.$((10 + k)).1/24 $R2 r2l$k 10.77.$((10 + k)).2/24
    done
    # Hosts keep a socket's hash after a timeout (over veth the routers'
    # L4 hash takes the sender's socket hash; TCP would otherwise move).
    for n in $C $S; do x $n sh -c 'echo 0 > /proc/sys/net/core/txrehash' 2>/dev/null || true; done
    ip -n $C route add default via 10.77.1.2
    ip -n $S route add default via 10.77.2.1
    for r in "$R1 1 2 10.77.2.0/24" "$R2 2 1 10.77.1.0/24"; do
        set -- $r
        x $1 sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward; echo 1 > /proc/sys/net/ipv4/fib_multipath_hash_policy'
        group=
        for k in $(seq 0 $((links - 1))); do
            ip -n $1 nexthop add id $((k + 1)) via 10.77.$((10 + k)).$3 dev r$2l$k
            group=${group:+$group/}$((k + 1))
        done
        ip -n $1 nexthop add id 100 group "$group"
        ip -n $1 route add $4 nhid 100
        x $1 nft add table inet mrfab
        x $1 nft 'add chain inet mrfab frags { type filter hook forward priority -10 ; }'
        x $1 nft add rule inet mrfab frags ip frag-off '&' 0x3fff != 0 counter
        x $1 nft 'add chain inet mrfab bh { type filter hook forward priority 0 ; }'
    done
    ;;
blackhole)
    k=$2
    x $R1 nft add rule inet mrfab bh oifname "r1l$k" counter drop
    x $R2 nft add rule inet mrfab bh oifname "r2l$k" counter drop
    ;;
heal)
    for r in $R1 $R2; do x $r nft flush chain inet mrfab bh; done
    ;;
stats)
    for dev in $(ip -n $R1 -o link show | awk -F': ' '{print $2}' | grep '^r1l' | cut -d@ -f1); do
        echo "$dev tx_bytes $(ip -n $R1 -s -j link show dev "$dev" | sed -E 's/.*"tx":\{"bytes":([0-9]+).*/\1/')"
    done
    for n in $C $R1 $R2 $S; do
        echo "$n $(x $n awk '/^Ip:/ {if (h) {print "FragCreates=" $f " ReasmReqds=" $r} else {for (i=1;i<=NF;i++) {if ($i=="FragCreates") f=i; if ($i=="ReasmReqds") r=i}; h=1}}' /proc/net/snmp)"
    done
    for r in $R1 $R2; do echo "$r forwarded fragments: $(x $r nft list chain inet mrfab frags | grep -o 'packets [0-9]*')"; done
    ;;
down)
    for n in $C $R1 $R2 $S; do ip netns del $n 2>/dev/null || true; done
    ;;
*) echo "usage: $0 up [LINKS] [MTU] | blackhole K | heal | stats | down" >&2; exit 2 ;;
esac
