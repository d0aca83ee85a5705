#!/usr/bin/env bash
# /flags load test: builds Corvid (release), creates N flags (default 20; also run with 300)
# through the API, then drives POST /flags?v=2 with person properties in the body using wrk
# from this same machine.
# Usage: benches/load/flags.sh [N flags, default 20] [seconds, default 20]
set -euo pipefail
cd "$(dirname "$0")/../.."
FLAGS="${1:-20}"
DURATION="${2:-20}"
PORT="${PORT:-18002}"
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
python3 benches/load/flags_setup.py "$BASE" "$KEY" "$TOKEN" "$FLAGS" "$DATA/flags.json"
curl -sf -XPOST "$BASE/flags?v=2" -H 'Content-Type: application/json' -d @"$DATA/flags.json" | python3 -c "import json,sys; print('flags returned:', len(json.load(sys.stdin)['flags']))"
echo "== POST /flags?v=2 with $FLAGS flags"
wrk -t1 -c32 -d"${DURATION}s" --latency -s benches/load/post.lua "$BASE/flags?v=2" -- "$DATA/flags.json"
