#!/usr/bin/env bash
# /batch/ capture (gzip, 100 events of ~450 B a request, 64 conns, default fsync durability)
# for two server builds in turn: for each round, build A then build B, each on a fresh data
# dir, a 3 s warm-up, then the measured run; prints the events acknowledged a second, the
# requests refused and the latency percentiles.
# Usage: benches/load/batch_ab.sh BIN_A BIN_B [rounds, default 2] [seconds, default 15]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS="${3:-2}"
DURATION="${4:-15}"
PORT="${PORT:-18038}"
. benches/load/ab_lib.sh
for _ in $(seq 1 "$ROUNDS"); do
  for bin in "$1" "$2"; do
    ab_start "$bin"
    wrk -t1 -c64 -d3s -s benches/load/post.lua "$BASE/batch/" -- "$DATA/batch.json.gz" gzip >/dev/null
    wrk -t1 -c64 -d"${DURATION}s" --latency -s benches/load/post.lua "$BASE/batch/" -- "$DATA/batch.json.gz" gzip >"$DATA/wrk.txt" 2>/dev/null
    # Only acknowledged events count: a request refused (503 when the buffers are full) is
    # taken off the rate.
    echo "$bin: $(awk '/requests in/ {n = $1; secs = $4; sub(/s,?$/, "", secs)} /^Non-2xx/ {bad = $NF} $1 == "50%" {m = $2} $1 == "99%" {p = $2} END {printf "%.0f events/s acknowledged, %d requests refused, p50 %s, p99 %s", (n - bad) * 100 / secs, bad, m, p}' "$DATA/wrk.txt")"
    ab_stop
  done
done
