#!/usr/bin/env bash
# Execution-log search over ~1M entries of one endpoint, through the real server: builds Corvid
# (release), creates an endpoint, drives cached runs with wrk until the log holds at least
# 1,000,000 entries (each run writes one, through the real writer and its blocks), then times
# GET …/logs/ searches with curl (10 runs each; the median is what docs/PERFORMANCE.md reports).
# Usage: benches/load/endpoint_logs.sh [entries, default 1000000]
set -euo pipefail
cd "$(dirname "$0")/../.."
ENTRIES="${1:-1000000}"
PORT="${PORT:-18005}"
CONFIG_FILE="$(mktemp --suffix=.toml)"
cat >"$CONFIG_FILE" <<'TOML'
[endpoints]
inline_per_minute = 1000000000
inline_per_hour = 1000000000
TOML
. benches/load/lib.sh
AUTH="Authorization: Bearer $KEY"
curl -sf -XPOST "$BASE/api/environments/1/endpoints/" -H "$AUTH" -H 'Content-Type: application/json' \
  -d '{"name": "logged", "is_materialized": false, "query": {"kind": "HogQLQuery", "query": "SELECT 1"}}' >/dev/null
echo '{}' >"$DATA/run.json"
RUN="$BASE/api/environments/1/endpoints/logged/run"
curl -sf -XPOST "$RUN" -H "$AUTH" -H 'Content-Type: application/json' -d '{}' >/dev/null
# Runs until the log holds ENTRIES (wrk reports how many requests it made).
total=0
while [ "$total" -lt "$ENTRIES" ]; do
  n=$(wrk -t1 -c32 -d10s -s benches/load/post.lua "$RUN" -- "$DATA/run.json" "bearer=$KEY" | awk '/requests in/ {print $1}')
  total=$((total + n))
  echo "runs so far: $total"
done
sleep 1
LOGS="$BASE/api/environments/1/endpoints/logged/logs/"
measure() {
  local label="$1" query="$2"
  local times=()
  for _ in $(seq 1 10); do
    times+=("$(curl -s -o /dev/null -w '%{time_total}' -H "$AUTH" "$LOGS?$query")")
  done
  printf '%s\n' "${times[@]}" | sort -n | awk -v l="$label" '{a[NR]=$1} END {printf "%-40s median %.1f ms  (min %.1f, max %.1f)\n", l, a[int((NR+1)/2)]*1000, a[1]*1000, a[NR]*1000}'
}
measure "search, no match (full scan)" "search=error%3DMemoryLimit&limit=50"
measure "level=ERROR (none exist: full scan)" "level=ERROR&limit=50"
measure "search matching every entry, limit 500" "search=path%3Dinline&limit=500"
measure "newest page (limit 50)" "limit=50"
curl -s -H "$AUTH" "$LOGS?limit=1" | python3 -c "import json,sys; r=json.load(sys.stdin)['results']; print('newest entry:', r[0]['message'])"
rm -f "$CONFIG_FILE"
