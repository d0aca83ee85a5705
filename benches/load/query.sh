#!/usr/bin/env bash
# The query issue's three queries through the HTTP API (`POST /api/projects/{id}/query/`) of a
# release server whose events are a generated data set: median and best of N warm runs each,
# plus a tiny query (one minute of data) that shows the fixed cost of a query.
#
# The data set is the one `cargo bench --bench query_engine` writes (10 M events, segments by
# Corvid's own writer); pass its directory. It is copied into a fresh data dir and the
# server's own compactor rewrites the copy (current layout, promoted frequent keys) before the
# measured runs; the original is never touched.
# Usage: benches/load/query.sh [data set dir, default target/bench-data/query-10000000] [runs, default 10]
set -euo pipefail
cd "$(dirname "$0")/../.."
SET="${1:-target/bench-data/query-10000000}"
RUNS="${2:-10}"
PORT="${PORT:-18004}"
[ -d "$SET/project=1" ] || { echo "no data set in $SET: run cargo bench --bench query_engine first"; exit 1; }
cargo build --release --quiet
BIN="${CARGO_TARGET_DIR:-target}/release/corvid"
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
# First start creates the project (id 1) and its keys; the events go in while it is stopped.
start
kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
mkdir -p "$DATA/events" && cp -r "$SET/project=1" "$DATA/events/"
# Let the server's compactor bring every segment to the current layout (sorted by event and
# time, promoted property columns) before measuring, as a long-running server would have:
# a pass every second; done when it reports its work, or when no file has changed for 30 s
# (a data set already in the current layout has nothing to rewrite).
printf '[ingest]\ncompaction_interval = "1s"\ncompaction_grace = "1s"\n' >"$DATA/compact.toml"
CONFIG_FILE="$DATA/compact.toml" LOG=info start
echo "compacting the copy (the server's own compactor)..."
last="" stable=0
for _ in $(seq 1 900); do
  grep -q "property-column compaction" "$DATA/server.log" && break
  now="$(ls -l "$DATA/events/project=1"/* | md5sum)"
  if [ "$now" = "$last" ]; then stable=$((stable + 2)); else stable=0; last="$now"; fi
  [ "$stable" -ge 30 ] && break
  sleep 2
done
kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
start
KEY=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['personal_api_key'])" "$DATA/credentials.json")
python3 - "$BASE" "$KEY" "$RUNS" <<'PY'
import json, statistics, sys, time, urllib.request

base, key, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
project = json.load(urllib.request.urlopen(urllib.request.Request(f"{base}/api/projects/", headers=auth)))["results"][0]["id"]
queries = {
    "count() GROUP BY event": {"kind": "HogQLQuery", "query": "SELECT event, count() FROM events GROUP BY event"},
    "trend 30d daily by $browser": {
        "kind": "TrendsQuery", "series": [{"kind": "EventsNode", "event": "$pageview"}], "interval": "day",
        "dateRange": {"date_from": "2024-06-01", "date_to": "2024-06-30"},
        "breakdownFilter": {"breakdown": "$browser", "breakdown_type": "event"}},
    "uniq(person_id) 7d": {"kind": "HogQLQuery", "query":
        "SELECT uniq(person_id) FROM events WHERE timestamp >= toDateTime('2024-06-24 00:00:00')"},
    "uniqExact(person_id) 7d": {"kind": "HogQLQuery", "query":
        "SELECT uniqExact(person_id) FROM events WHERE timestamp >= toDateTime('2024-06-24 00:00:00')"},
    "tiny (last minute)": {"kind": "HogQLQuery", "query":
        "SELECT count() FROM events WHERE timestamp >= toDateTime('2024-06-30 23:59:00')"},
}
for name, query in queries.items():
    body = json.dumps({"query": query}).encode()
    def run():
        req = urllib.request.Request(f"{base}/api/projects/{project}/query/", data=body, headers=auth, method="POST")
        return json.load(urllib.request.urlopen(req, timeout=300))
    first = run()  # warms the OS cache and the footer cache
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    rows = first.get("results") or []
    print(f"{name}: median {statistics.median(times):.1f} ms, best {min(times):.1f} ms ({len(rows)} rows)")
PY
