#!/usr/bin/env bash
# Single-event capture with a new user per request for two server builds in turn: each round runs
# both, A first in odd rounds and B first in even ones (ab_order), each on a fresh data dir,
# driven with capture_users.lua (32 conns), printing req/s, the latency percentiles and the WAL's
# syncs.
# Usage: benches/load/capture_users_ab.sh BIN_A BIN_B [rounds, default 2] [seconds, default 20]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS="${3:-2}"
DURATION="${4:-20}"
PORT="${PORT:-18038}"
. benches/load/ab_lib.sh
for round in $(seq 1 "$ROUNDS"); do
  for bin in $(ab_order "$round" "$1" "$2"); do
    ab_start "$bin"
    ab_wal_mark
    wrk -t1 -c32 -d"${DURATION}s" --latency -s benches/load/capture_users.lua "$BASE/i/v0/e/" -- "$DATA/single.json" >"$DATA/wrk.txt"
    echo "$bin: $(awk '/^Requests\/sec/ {r = $2} $1 == "50%" {m = $2} $1 == "90%" {n = $2} $1 == "99%" {p = $2} END {printf "%.0f req/s, p50 %s, p90 %s, p99 %s", r, m, n, p}' "$DATA/wrk.txt"); $(ab_wal_since)"
    ab_stop
  done
done
