#!/usr/bin/env bash
# Capture load test: builds Corvid (release), starts it on a temp data dir with default
# (fsync) durability, and drives it with wrk from this same machine:
#   1. /batch/ with gzipped batches of 100 events (~500 B each)
#   2. single events on /i/v0/e/
#   3. event-to-queryable latency probes while /batch/ load runs
# Usage: benches/load/capture.sh [seconds per scenario, default 20]
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION="${1:-20}"
PORT="${PORT:-18000}"
BASE="http://127.0.0.1:$PORT"

if ! command -v wrk >/dev/null; then
  echo "installing wrk (Debian package)"; apt-get update -qq && apt-get install -y -qq wrk
fi
cargo build --release --quiet
DATA="$(mktemp -d)"
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; rm -rf "$DATA"' EXIT
RUST_LOG=warn ./target/release/corvid serve --data-dir "$DATA" --bind "127.0.0.1:$PORT" >/dev/null 2>"$DATA/server.log" &
SERVER=$!
for _ in $(seq 1 100); do curl -sf "$BASE/_readiness" >/dev/null && break; sleep 0.1; done
TOKEN=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['project_token'])" "$DATA/credentials.json")
KEY=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['personal_api_key'])" "$DATA/credentials.json")
python3 benches/load/make_bodies.py "$TOKEN" "$DATA"

echo "== /batch/, gzip, 100 events per request (events/s = requests/s x 100)"
wrk -t1 -c64 -d"${DURATION}s" --latency -s benches/load/post.lua "$BASE/batch/" -- "$DATA/batch.json.gz" gzip

echo "== /i/v0/e/, one event per request"
wrk -t1 -c32 -d"${DURATION}s" --latency -s benches/load/post.lua "$BASE/i/v0/e/" -- "$DATA/single.json"

echo "== event-to-queryable under /batch/ load"
wrk -t1 -c32 -d"$((DURATION + 10))s" -s benches/load/post.lua "$BASE/batch/" -- "$DATA/batch.json.gz" gzip >/dev/null &
LOAD=$!
sleep 2
python3 benches/load/queryable.py "$BASE" "$TOKEN" "$KEY" 200
wait "$LOAD" || true
