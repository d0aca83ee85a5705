#!/usr/bin/env bash
# Endpoint run load test: builds Corvid (release), seeds 100k events, creates a materialized SQL
# endpoint with one variable and an inline one, then drives runs with wrk from this machine:
#   1. materialized runs (refresh=force: every request filters the stored Arrow result);
#   2. cached inline runs (refresh=cache: served from the results cache).
# Rate limits are raised for the test (they are per key; one key drives all the load).
# Usage: [CONNS=32] [WORKERS=n] [PACE_MS=ms] benches/load/endpoints.sh [seconds, default 20]
# PACE_MS adds a run at a held rate below saturation (see post_paced.lua).
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION="${1:-20}"
CONNS="${CONNS:-32}"
PORT="${PORT:-18003}"
CONFIG_FILE="$(mktemp --suffix=.toml)"
cat >"$CONFIG_FILE" <<'TOML'
[endpoints]
inline_per_minute = 1000000000
inline_per_hour = 1000000000
materialized_per_minute = 1000000000
materialized_per_hour = 1000000000
TOML
# WORKERS=n sets server.workers (default: one per core).
if [ -n "${WORKERS:-}" ]; then printf '[server]\nworkers = %s\n' "$WORKERS" >>"$CONFIG_FILE"; fi
. benches/load/lib.sh
python3 benches/load/endpoints_setup.py "$BASE" "$KEY" "$TOKEN" "$DATA"
MAT_PATH=$(sed -n 1p "$DATA/paths.txt")
CACHED_PATH=$(sed -n 2p "$DATA/paths.txt")
echo "== materialized endpoint, one variable (refresh=force)"
wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s benches/load/post.lua "$BASE$MAT_PATH" -- "$DATA/materialized.json" "bearer=$KEY"
if [ -n "${PACE_MS:-}" ]; then
  echo "== materialized endpoint at a held rate (each connection pauses ${PACE_MS} ms between runs)"
  wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s benches/load/post_paced.lua "$BASE$MAT_PATH" -- "$PACE_MS" "$DATA/materialized.json" "bearer=$KEY"
fi
echo "== cached inline endpoint (refresh=cache)"
wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s benches/load/post.lua "$BASE$CACHED_PATH" -- "$DATA/cached.json" "bearer=$KEY"
rm -f "$CONFIG_FILE"
