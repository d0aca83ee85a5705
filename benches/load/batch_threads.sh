#!/usr/bin/env bash
# The server's CPU per acknowledged /batch/ event, by thread: the per-thread user and system
# times in /proc before and after a wrk run of make_batch_bodies.py's varied gzip bodies
# (64 conns, default fsync durability, a 4 s warm-up first), divided by the events
# acknowledged. Run it for two builds in turn, alternating, to compare where they spend.
# Threads are named as ab_lib.sh lists them.
# Usage: benches/load/batch_threads.sh BIN [seconds, default 15]
set -euo pipefail
cd "$(dirname "$0")/../.."
PORT="${PORT:-18041}"
DURATION="${2:-15}"
. benches/load/ab_lib.sh
ab_start "$1"
python3 benches/load/make_batch_bodies.py "$TOKEN" "$DATA" >/dev/null
script=(-s benches/load/batch_bodies.lua "$BASE/batch/" -- "$DATA/batches.bin" "$DATA/batches.idx")
wrk -t1 -c64 -d4s "${script[@]}" >/dev/null
ab_threads_mark
wrk -t1 -c64 -d"${DURATION}s" "${script[@]}" >"$DATA/wrk.txt"
events=$(awk '/requests in/ {n = $1} /Non-2xx/ {bad = $NF} END {print (n - bad) * 100}' "$DATA/wrk.txt")
echo "== $events events acknowledged in ${DURATION} s ($((events / DURATION)) a second); CPU an event by thread:"
ab_threads_since "$events"
ab_stop
