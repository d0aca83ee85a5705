#!/usr/bin/env bash
# Capture load test: builds Corvid (release), starts it on a temp data dir with default
# (fsync) durability, and drives it with wrk from this same machine:
#   1. /batch/ with gzipped batches of 100 events (~500 B each)
#   2. single events on /i/v0/e/
#   3. event-to-queryable latency probes while /batch/ load runs
# Usage: [SINGLE_CONNS=c, default 32] benches/load/capture.sh [seconds per scenario, default 20]
# (SINGLE_CONNS: connections of the single-event scenario.)
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION="${1:-20}"
PORT="${PORT:-18000}"

. benches/load/lib.sh
python3 benches/load/make_bodies.py "$TOKEN" "$DATA"

echo "== /batch/, gzip, 100 events per request (events/s = requests/s x 100)"
wrk -t1 -c64 -d"${DURATION}s" --latency -s benches/load/post.lua "$BASE/batch/" -- "$DATA/batch.json.gz" gzip

echo "== /i/v0/e/, one event per request"
wrk -t1 -c"${SINGLE_CONNS:-32}" -d"${DURATION}s" --latency -s benches/load/post.lua "$BASE/i/v0/e/" -- "$DATA/single.json"

echo "== event-to-queryable under /batch/ load"
wrk -t1 -c32 -d"$((DURATION + 10))s" -s benches/load/post.lua "$BASE/batch/" -- "$DATA/batch.json.gz" gzip >/dev/null &
LOAD=$!
sleep 2
python3 benches/load/queryable.py "$BASE" "$TOKEN" "$KEY" 200
wait "$LOAD" || true
