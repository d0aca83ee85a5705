#!/usr/bin/env bash
# A/B of two server builds in one run: the capture, flags and endpoints load scripts and a query
# set, each run with build A then build B back to back, so the machine's drift between them is
# as small as it can be. Prints each scenario's figure for both and the ratio B/A.
#
# The query set runs over events captured through /batch/ by build B once (a few million
# events of the capture script's bodies), copied into a fresh data dir for each build.
# Usage: benches/load/ab.sh BIN_A BIN_B [seconds per scenario, default 10]
set -euo pipefail
cd "$(dirname "$0")/../.."
A="$1"
B="$2"
DURATION="${3:-10}"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

# wrk's "Requests/sec" lines of a script's output, one per scenario, in order.
rates() { grep -E '^Requests/sec' "$1" | awk '{print $2}'; }
# p99 latency lines, in order.
p99s() { grep -E '^ +99%' "$1" | awk '{print $2}'; }

compare() {
  local name="$1" a="$2" b="$3"
  paste <(rates "$a") <(rates "$b") <(p99s "$a") <(p99s "$b") | while read -r ra rb pa pb; do
    ratio=$(python3 -c "print(f'{$rb / $ra:.3f}')")
    echo "$name: A $ra req/s (p99 $pa) | B $rb req/s (p99 $pb) | B/A $ratio"
  done
}

for script in capture flags endpoints; do
  for side in A B; do
    bin="$A"; [ "$side" = B ] && bin="$B"
    echo "== $script.sh with build $side" >&2
    BIN="$bin" benches/load/"$script".sh "$DURATION" >"$OUT/$script.$side" 2>&1
  done
  compare "$script" "$OUT/$script.A" "$OUT/$script.B"
done

# Queries: capture a data set once with build B, then query a copy of it with each build.
PORT=18010
BASE="http://127.0.0.1:$PORT"
serve() {
  RUST_LOG=warn "$1" serve --data-dir "$2" --bind "127.0.0.1:$PORT" >/dev/null 2>>"$2/server.log" &
  SERVER=$!
  for _ in $(seq 1 300); do curl -sf "$BASE/_readiness" >/dev/null && return; sleep 0.1; done
  echo "server did not start"; exit 1
}
stop() { kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; }
SET="$OUT/set"
mkdir -p "$SET"
serve "$B" "$SET"
TOKEN=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['project_token'])" "$SET/credentials.json")
python3 benches/load/make_bodies.py "$TOKEN" "$OUT"
wrk -t1 -c64 -d"$((DURATION * 2))s" -s benches/load/post.lua "$BASE/batch/" -- "$OUT/batch.json.gz" gzip >/dev/null
stop
for side in A B; do
  bin="$A"; [ "$side" = B ] && bin="$B"
  rm -rf "$OUT/copy" && cp -r "$SET" "$OUT/copy"
  serve "$bin" "$OUT/copy"
  KEY=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['personal_api_key'])" "$OUT/copy/credentials.json")
  python3 - "$BASE" "$KEY" "$side" >>"$OUT/query" <<'PY'
import json, statistics, sys, time, urllib.request

base, key, side = sys.argv[1], sys.argv[2], sys.argv[3]
auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
queries = {
    "count() GROUP BY event": {"kind": "HogQLQuery", "query": "SELECT event, count() FROM events GROUP BY event"},
    "trend 7d daily by $browser": {
        "kind": "TrendsQuery", "series": [{"kind": "EventsNode", "event": "$pageview"}], "interval": "day",
        "dateRange": {"date_from": "-7d"}, "breakdownFilter": {"breakdown": "$browser", "breakdown_type": "event"}},
    "uniq(person_id)": {"kind": "HogQLQuery", "query": "SELECT uniq(person_id) FROM events"},
}
for name, query in queries.items():
    body = json.dumps({"query": query}).encode()
    def run():
        req = urllib.request.Request(f"{base}/api/projects/1/query/", data=body, headers=auth, method="POST")
        return json.load(urllib.request.urlopen(req, timeout=300))
    run()
    times = []
    for _ in range(15):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    print(f"{side}\t{name}\t{statistics.median(times):.1f}")
PY
  stop
done
python3 - "$OUT/query" <<'PY'
import sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1])]
a = {name: float(ms) for side, name, ms in rows if side == "A"}
b = {name: float(ms) for side, name, ms in rows if side == "B"}
for name in a:
    print(f"query {name}: A {a[name]:.1f} ms | B {b[name]:.1f} ms | B/A {b[name] / a[name]:.3f}")
PY
