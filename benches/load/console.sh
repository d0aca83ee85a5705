#!/usr/bin/env bash
# Console render times with a big project, through the real server: builds Corvid (release),
# creates 1,000 flags and drives endpoint runs until the execution log holds 100,000 entries,
# signs in as the admin, then times each console page (200 requests each, sequential; p50 and
# p95 as docs/PERFORMANCE.md reports). The goal: every page's p95 ≤ 100 ms.
# Usage: benches/load/console.sh [flags, default 1000] [log entries, default 100000]
set -euo pipefail
cd "$(dirname "$0")/../.."
FLAGS="${1:-1000}"
ENTRIES="${2:-100000}"
PORT="${PORT:-18007}"
CONFIG_FILE="$(mktemp --suffix=.toml)"
# One key drives every run: its run allowances (inline and materialized; the endpoint is
# materialized a few seconds after it is made) are lifted so that no run is refused.
cat >"$CONFIG_FILE" <<'TOML'
[endpoints]
inline_per_minute = 1000000000
inline_per_hour = 1000000000
materialized_per_minute = 1000000000
materialized_per_hour = 1000000000
# wrk's 32 connections run at once on one key: none is refused, so every request is a
# logged run.
[query]
max_concurrent = 32
max_concurrent_per_credential = 32
TOML
. benches/load/lib.sh
AUTH="Authorization: Bearer $KEY"
python3 benches/load/console_setup.py "$BASE" "$KEY" "$FLAGS"
echo '{}' >"$DATA/run.json"
RUN="$BASE/api/projects/1/endpoints/logged/run"
total=0
while [ "$total" -lt "$ENTRIES" ]; do
  # Runs answered 2xx (each wrote one log entry): requests less the non-2xx ones.
  n=$(wrk -t1 -c32 -d5s -s benches/load/post.lua "$RUN" -- "$DATA/run.json" "bearer=$KEY" 2>"$DATA/refused.txt" |
    awk '/requests in/ {n = $1} /Non-2xx/ {bad = $NF} END {print n - bad}')
  total=$((total + n))
  echo "runs so far: $total"
  # The first refusals' reasons, if any (one line each).
  sort "$DATA/refused.txt" | uniq -c | head -3
done
sleep 1
# What the execution log holds now (every run writes one entry; the writer drops none unless
# it falls far behind, and then this says so).
logged=$(curl -sf -H "$AUTH" "$BASE/api/projects/1/logs/search/?after=$(date -u -d '1 hour ago' +%Y-%m-%dT%H:%M:%SZ)&limit=1" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["total"])')
echo "execution-log entries: $logged"
[ "$logged" -ge "$ENTRIES" ] || { echo "fewer than $ENTRIES entries logged" >&2; exit 1; }
python3 benches/load/console_pages.py "$BASE" "$DATA/credentials.json"
rm -f "$CONFIG_FILE"
