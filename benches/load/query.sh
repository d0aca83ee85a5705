#!/usr/bin/env bash
# The query issue's three queries through the HTTP API (`POST /api/projects/{id}/query/`) of a
# release server whose events are a generated data set: median and best of N warm runs each,
# plus a tiny query (one minute of data) that shows the fixed cost of a query.
#
# The data set is the one `cargo bench --bench query_engine` writes (10 M events, segments by
# Corvid's own writer); pass its directory. It is copied into a fresh data dir and the
# server's own compactor rewrites the copy (event_set.sh) before the measured runs.
# Usage: benches/load/query.sh [data set dir, default target/bench-data/query-10000000] [runs, default 10]
set -euo pipefail
cd "$(dirname "$0")/../.."
SET="${1:-target/bench-data/query-10000000}"
RUNS="${2:-10}"
PORT="${PORT:-18004}"
[ -d "$SET/project=1" ] || { echo "no data set in $SET: run cargo bench --bench query_engine first"; exit 1; }
. benches/load/build.sh
BASE="http://127.0.0.1:$PORT"
DATA="$(mktemp -d)"
SERVER=""
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true; rm -rf "$DATA"' EXIT
start() {
  RUST_LOG="${LOG:-warn}" "$BIN" serve ${CONFIG_FILE:+--config "$CONFIG_FILE"} --data-dir "$DATA" --bind "127.0.0.1:$PORT" >/dev/null 2>>"$DATA/server.log" &
  SERVER=$!
  for _ in $(seq 1 300); do curl -sf "$BASE/_readiness" >/dev/null && return; sleep 0.1; done
  echo "server did not start"; exit 1
}
. benches/load/event_set.sh
seed_event_set "$SET"
start
KEY=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['personal_api_key'])" "$DATA/credentials.json")
python3 benches/load/event_queries.py "$BASE" "$KEY" "$RUNS"
