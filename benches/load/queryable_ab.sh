#!/usr/bin/env bash
# Event-to-queryable of two server builds in turn: each round runs both, A first in odd rounds and
# B first in even ones (ab_order), each on a fresh data dir under /batch/ load (gzip, 100 events a
# request, 32 conns, as capture.sh probes under) with 100 probes (queryable.py), and the /batch/
# rate during them.
# Usage: benches/load/queryable_ab.sh BIN_A BIN_B [rounds, default 2]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS="${3:-2}"
PORT="${PORT:-18036}"
. benches/load/ab_lib.sh
for round in $(seq 1 "$ROUNDS"); do
  for bin in $(ab_order "$round" "$1" "$2"); do
    ab_start "$bin"
    wrk -t1 -c32 -d30s -s benches/load/post.lua "$BASE/batch/" -- "$DATA/batch.json.gz" gzip >"$DATA/wrk.txt" &
    load=$!
    sleep 8
    echo "$bin: $(python3 benches/load/queryable.py "$BASE" "$TOKEN" "$KEY" 100)"
    wait "$load"
    echo "  /batch/ during the probes: $(awk '/^Requests\/sec/ {printf "%.0f events/s", $2 * 100}' "$DATA/wrk.txt")"
    ab_stop
  done
done
