#!/usr/bin/env bash
# Single-event capture with known users for two server builds in turn: each round runs both, A
# first in odd rounds and B first in even ones (ab_order), each on a fresh data dir with KNOWN
# persons seeded through /batch/ (known_persons.py), then /i/v0/e/ with half the events from known
# persons doing `$set` and half from new users (capture_known.lua, CONNS conns), printing req/s, the
# latency percentiles and the WAL's syncs.
# Usage: [KNOWN=1000000] [CONNS=32] benches/load/capture_ab.sh BIN_A BIN_B [rounds, default 2] [seconds, default 20]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS="${3:-2}"
DURATION="${4:-20}"
KNOWN="${KNOWN:-1000000}"
CONNS="${CONNS:-32}"
PORT="${PORT:-18037}"
. benches/load/ab_lib.sh
for round in $(seq 1 "$ROUNDS"); do
  for bin in $(ab_order "$round" "$1" "$2"); do
    ab_start "$bin"
    python3 benches/load/known_persons.py "$BASE" "$TOKEN" "$KNOWN" "$KEY" >/dev/null
    ab_wal_mark
    wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s benches/load/capture_known.lua "$BASE/i/v0/e/" -- "$DATA/single.json" "$KNOWN" >"$DATA/wrk.txt"
    echo "$bin: $(awk '/^Requests\/sec/ {r = $2} $1 == "50%" {m = $2} $1 == "99%" {p = $2} END {printf "%.0f req/s, p50 %s, p99 %s", r, m, p}' "$DATA/wrk.txt"); $(ab_wal_since)"
    ab_stop
  done
done
