#!/usr/bin/env bash
# A big customer's node restarted: the 100 M-event data set (`cargo bench --bench query_engine`,
# generated once under SETS and linked into the data dir, in its generated layout) and 10 M known
# persons seeded through /batch/ (known_persons.py) with the big-customer flag set, then the
# server killed (-9) right after the seed and started again:
#   - seconds until /_readiness answers, and until every person is in memory again;
#   - RSS at both moments;
#   - /flags?v=2 as big_customer.lua drives it (half known users sending only their country,
#     half new users), req/s and p99, and RSS after it.
# The events are linked, not copied, and the compactor is held off (`compaction_interval`), so
# the run needs room only for the persons (about 4 GB), not for a rewrite of the set.
# Usage: [PERSONS=10000000] [EVENTS=100000000] [SETS=target/bench-data] [CONNS=64] benches/load/restart_big.sh [seconds of /flags, default 15]
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION="${1:-15}"
PERSONS="${PERSONS:-10000000}"
EVENTS="${EVENTS:-100000000}"
SETS="${SETS:-target/bench-data}"
CONNS="${CONNS:-64}"
PORT="${PORT:-18033}"
. benches/load/build.sh
. benches/load/event_set.sh
BASE="http://127.0.0.1:$PORT"
SET="$SETS/query-$EVENTS"
ensure_event_set "$EVENTS" "$SET"
DATA="$(mktemp -d)"
SERVER=""
trap 'kill -9 "$SERVER" 2>/dev/null || true; rm -rf "$DATA"' EXIT
start() {
  RUST_LOG=warn "$BIN" serve --config "$DATA/held.toml" --data-dir "$DATA" --bind "127.0.0.1:$PORT" >/dev/null 2>>"$DATA/server.log" &
  SERVER=$!
  for _ in $(seq 1 60000); do curl -sf "$BASE/_readiness" >/dev/null && return; sleep 0.01; done
  echo "the server did not start" >&2
  exit 1
}
rss_mib() { echo $(($(ps -o rss= -p "$SERVER") / 1024)); }
since() { echo "$(date +%s.%N) - $1" | bc -l | xargs printf '%.2f'; }
printf '[ingest]\ncompaction_interval = "100d"\n' >"$DATA/held.toml"
start
kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
mkdir -p "$DATA/events" && cp -al "$SET/project=1" "$DATA/events/"
start
KEY=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['personal_api_key'])" "$DATA/credentials.json")
TOKEN=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['project_token'])" "$DATA/credentials.json")
python3 benches/load/big_customer_flags.py "$BASE" "$KEY" 20 "$DATA/edge.json" >/dev/null
python3 benches/load/known_persons.py "$BASE" "$TOKEN" "$PERSONS" "$KEY"
echo "RSS seeded: $(rss_mib) MiB"
kill -9 "$SERVER"; wait "$SERVER" 2>/dev/null || true
began=$(date +%s.%N)
start
echo "restart to ready: $(since "$began") s, RSS $(rss_mib) MiB"
for _ in $(seq 1 6000); do
  curl -sf "$BASE/metrics" | grep -q '^corvid_persons_memory_complete 1' && break
  sleep 0.1
done
echo "every person in memory again: $(since "$began") s, RSS $(rss_mib) MiB"
curl -sf "$BASE/metrics" | grep '^corvid_persons_memory' | tr '\n' ' '
echo
echo "{\"token\": \"$TOKEN\"}" >"$DATA/flags.json"
POOL=$((DURATION * 90000)) wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s benches/load/big_customer.lua "$BASE/flags?v=2" -- "$DATA/flags.json" "$PERSONS" >"$DATA/wrk.txt"
echo "/flags: $(awk '/^Requests\/sec/ {print $2}' "$DATA/wrk.txt") req/s, p99 $(awk '$1 == "99%" {print $2}' "$DATA/wrk.txt"), RSS after $(rss_mib) MiB"
