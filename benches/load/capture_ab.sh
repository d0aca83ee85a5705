#!/usr/bin/env bash
# Single-event capture with known users for two server builds in turn: for each round, build A
# then build B, each on a fresh data dir with KNOWN persons seeded through /batch/
# (known_persons.py), then /i/v0/e/ with half the events from known persons doing `$set` and
# half from new users (capture_known.lua, 32 conns), printing req/s and the latency
# percentiles.
# Usage: [KNOWN=1000000] benches/load/capture_ab.sh BIN_A BIN_B [rounds, default 2] [seconds, default 20]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS="${3:-2}"
DURATION="${4:-20}"
KNOWN="${KNOWN:-1000000}"
PORT="${PORT:-18037}"
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
    python3 benches/load/known_persons.py "$BASE" "$TOKEN" "$KNOWN" "$KEY" >/dev/null
    wrk -t1 -c32 -d"${DURATION}s" --latency -s benches/load/capture_known.lua "$BASE/i/v0/e/" -- "$DATA/single.json" "$KNOWN" >"$DATA/wrk.txt"
    echo "$bin: $(awk '/^Requests\/sec/ {r = $2} $1 == "50%" {m = $2} $1 == "99%" {p = $2} END {printf "%.0f req/s, p50 %s, p99 %s", r, m, p}' "$DATA/wrk.txt")"
    kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
    rm -rf "$DATA"
  done
done
