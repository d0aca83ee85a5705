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
cat >"$CONFIG_FILE" <<'TOML'
[endpoints]
inline_per_minute = 1000000000
inline_per_hour = 1000000000
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
  n=$(wrk -t1 -c32 -d5s -s benches/load/post.lua "$RUN" -- "$DATA/run.json" "bearer=$KEY" |
    awk '/requests in/ {n = $1} /Non-2xx/ {bad = $NF} END {print n - bad}')
  total=$((total + n))
  echo "runs so far: $total"
done
sleep 1
python3 benches/load/console_pages.py "$BASE" "$DATA/credentials.json"
rm -f "$CONFIG_FILE"
