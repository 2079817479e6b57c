#!/usr/bin/env bash
# Byte-for-byte comparison of two builds' simulated and harness outputs.
#
#   scripts/check-outputs.sh OLD_BINARY NEW_BINARY [--with-d]
#
# Runs every committed scenario (with all four transports where the scenario
# is small enough), the default scenario, a sweep, and the harness loss sweep
# with both binaries, and diffs results.json, timeseries.json, flows.csv and
# the harness table. Wall-clock figures (perf.json, the "perf" line) are
# excluded: they differ run to run. Exit 0 when everything matches.
set -euo pipefail
old=$1 new=$2 with_d=${3:-}
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
scenarios=(scenarios/A-perm-128-ft.toml scenarios/B-perm-1024-ft.toml scenarios/C-incast-1023-ft.toml
  scenarios/E-allreduce-128-ft.toml scenarios/F-perm-128-ft-roce-pfc.toml scenarios/F-dcqcn-perm-128-ft-roce-pfc.toml
  scenarios/default.toml scenarios/incast-16-pfc.toml scenarios/multiplane-failure.toml
  scenarios/remote-failure-reconverge.toml scenarios/small-mix.toml)
[ "$with_d" = --with-d ] && scenarios+=(scenarios/D-perm-8192-ls-400g.toml)
compare() { # name: every output file of the two runs (wall-clock perf.json and plots aside)
  local name=$1
  if ! diff -rq -x perf.json -x '*.svg' "$work/old/$name" "$work/new/$name" >/dev/null 2>&1; then
    echo "DIFFERS: $name"
    fail=1
  fi
}
for s in "${scenarios[@]}"; do
  name=$(basename "$s" .toml)
  for which in old new; do
    bin=$old; [ $which = new ] && bin=$new
    "$bin" sim "$s" -q --out "$work/$which/$name" >/dev/null
  done
  compare "$name"
  case $name in B-*|C-*) continue ;; esac
  for t in rocev2 irn ib metaroce; do
    for which in old new; do
      bin=$old; [ $which = new ] && bin=$new
      "$bin" sim "$s" -q --transports $t --out "$work/$which/$name-$t" >/dev/null 2>&1 || true
    done
    compare "$name-$t"
  done
  echo "ok-or-reported: $name"
done
for which in old new; do
  bin=$old; [ $which = new ] && bin=$new
  "$bin" sim sweep scenarios/sweeps/paths-loss.toml -q --out "$work/$which/sweep" >/dev/null
  "$bin" harness | grep -v '^perf' > "$work/$which/harness.txt"
  "$bin" chaos --seeds 200 2>&1 | sed -E "s/, [0-9.]+ s\$//" > "$work/$which/chaos.txt" || true
done
for f in harness.txt chaos.txt; do
  cmp -s "$work/old/$f" "$work/new/$f" || { echo "DIFFERS: $f"; fail=1; }
done
diff -rq "$work/old/sweep" "$work/new/sweep" | grep -v perf || true
if diff -rq -x 'perf*' -x '*.svg' "$work/old/sweep" "$work/new/sweep" >/dev/null; then :; else echo "DIFFERS: sweep"; fail=1; fi
[ $fail = 0 ] && echo "all outputs identical"
exit $fail
