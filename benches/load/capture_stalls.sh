#!/usr/bin/env bash
# What the server does when a capture request is slow: one build on a fresh data dir under
# single-event load (new users, or with KNOWN set that many known persons seeded and half the
# events from them), with stall_probe.py sending its own requests and sampling the server's
# threads meanwhile. Prints the probes over the threshold and the threads running or waiting
# for the disk during each, then wrk's figures.
# Usage: [KNOWN=1000000] benches/load/capture_stalls.sh BIN [seconds, default 20] [threshold ms, default 40]
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION="${2:-20}"
KNOWN="${KNOWN:-0}"
PORT="${PORT:-18039}"
. benches/load/ab_lib.sh
ab_start "$1"
if [ "$KNOWN" = 0 ]; then
  load=(-s benches/load/capture_users.lua "$BASE/i/v0/e/" -- "$DATA/single.json")
else
  python3 benches/load/known_persons.py "$BASE" "$TOKEN" "$KNOWN" "$KEY" >/dev/null
  load=(-s benches/load/capture_known.lua "$BASE/i/v0/e/" -- "$DATA/single.json" "$KNOWN")
fi
ab_wal_mark
wrk -t1 -c32 -d"${DURATION}s" --latency "${load[@]}" >"$DATA/wrk.txt" &
WRK=$!
python3 benches/load/stall_probe.py "$BASE" "$TOKEN" "$((DURATION - 1))" "$SERVER" "${3:-40}"
wait "$WRK"
echo "wrk: $(awk '/^Requests\/sec/ {r = $2} $1 == "50%" {m = $2} $1 == "99%" {p = $2} END {printf "%.0f req/s, p50 %s, p99 %s", r, m, p}' "$DATA/wrk.txt"); $(ab_wal_since)"
ab_stop
