#!/usr/bin/env bash
# /batch/ capture (gzip, 100 events of ~470 B a request, 64 conns, default fsync durability)
# for two server builds in turn: each round runs both, A first in odd rounds and B first in
# even ones (ab_order), each on a fresh data dir, a 3 s warm-up, then the measured run; prints
# the events acknowledged a second, the requests refused and the latency percentiles, then
# each build's mean rate. Use an even number of rounds.
# The bodies are 2,000 varied batches (make_batch_bodies.py: browser and server queues, 100,000
# users, properties varying per event); BODY=repeated posts one body instead (make_bodies.py's
# batch.json.gz, 37 users), the lighter variant.
# Usage: [BODY=varied|repeated] benches/load/batch_ab.sh BIN_A BIN_B [rounds, default 2] [seconds, default 15]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS="${3:-2}"
DURATION="${4:-15}"
PORT="${PORT:-18038}"
. benches/load/ab_lib.sh
for round in $(seq 1 "$ROUNDS"); do
  for bin in $(ab_order "$round" "$1" "$2"); do
    ab_start "$bin"
    if [ "${BODY:-varied}" = repeated ]; then
      script=(-s benches/load/post.lua "$BASE/batch/" -- "$DATA/batch.json.gz" gzip)
    else
      python3 benches/load/make_batch_bodies.py "$TOKEN" "$DATA" >/dev/null
      script=(-s benches/load/batch_bodies.lua "$BASE/batch/" -- "$DATA/batches.bin" "$DATA/batches.idx")
    fi
    wrk -t1 -c64 -d3s "${script[@]}" >/dev/null
    wrk -t1 -c64 -d"${DURATION}s" --latency "${script[@]}" >"$DATA/wrk.txt" 2>/dev/null
    # Only acknowledged events count: a request refused (503 when the buffers are full) is
    # taken off the rate.
    line=$(awk '/requests in/ {n = $1; secs = $4; sub(/s,?$/, "", secs)} /Non-2xx/ {bad = $NF} $1 == "50%" {m = $2} $1 == "99%" {p = $2} END {printf "%.0f events/s acknowledged, %d requests refused, p50 %s, p99 %s", (n - bad) * 100 / secs, bad, m, p}' "$DATA/wrk.txt")
    echo "$bin: $line"
    ab_record "$bin" "${line%% *}"
    ab_stop
  done
done
echo "== events/s acknowledged"
ab_means
