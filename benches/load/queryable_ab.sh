#!/usr/bin/env bash
# Event-to-queryable of two server builds in turn: for each round, build A then build B, each on
# a fresh data dir under /batch/ load (gzip, 100 events a request, 32 conns, as capture.sh
# probes under) with 100 probes (queryable.py), and the /batch/ rate during them.
# Usage: benches/load/queryable_ab.sh BIN_A BIN_B [rounds, default 2]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS="${3:-2}"
PORT="${PORT:-18036}"
BASE="http://127.0.0.1:$PORT"
SERVER=""
DATA=""
trap 'kill "$SERVER" 2>/dev/null || true; [ -n "$DATA" ] && rm -rf "$DATA"' EXIT
for _ in $(seq 1 "$ROUNDS"); do
  for bin in "$1" "$2"; do
    DATA="$(mktemp -d)"
    RUST_LOG=warn "$bin" serve --data-dir "$DATA" --bind "127.0.0.1:$PORT" >/dev/null 2>"$DATA/server.log" &
    SERVER=$!
    for _ in $(seq 1 100); do curl -sf "$BASE/_readiness" >/dev/null && break; sleep 0.1; done
    TOKEN=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['project_token'])" "$DATA/credentials.json")
    KEY=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['personal_api_key'])" "$DATA/credentials.json")
    python3 benches/load/make_bodies.py "$TOKEN" "$DATA" >/dev/null
    wrk -t1 -c32 -d30s -s benches/load/post.lua "$BASE/batch/" -- "$DATA/batch.json.gz" gzip >"$DATA/wrk.txt" &
    load=$!
    sleep 8
    echo "$bin: $(python3 benches/load/queryable.py "$BASE" "$TOKEN" "$KEY" 100)"
    wait "$load"
    echo "  /batch/ during the probes: $(awk '/^Requests\/sec/ {printf "%.0f events/s", $2 * 100}' "$DATA/wrk.txt")"
    kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
    rm -rf "$DATA"
    DATA=""
  done
done
