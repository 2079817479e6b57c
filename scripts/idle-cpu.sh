#!/usr/bin/env bash
# The idle-device target of issue #14 (an idle device uses < 1 % of a
# CPU): two connected devices with nothing to send and one application
# thread waiting in poll_cq_wait, CPU time of the whole process (utime +
# stime) over SECONDS, as a share of one CPU; ROUNDS runs.
#
#   scripts/idle-cpu.sh [SECONDS] [ROUNDS]     # defaults: 5 s, 3 rounds
set -eu
SECS=${1:-5}
ROUNDS=${2:-3}
cargo build --release -q -p metaroce-udp --example idle
for _ in $(seq "$ROUNDS"); do
    target/release/examples/idle "$SECS"
done
