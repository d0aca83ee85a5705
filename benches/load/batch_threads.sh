#!/usr/bin/env bash
# The server's CPU per acknowledged /batch/ event, by thread: the per-thread user and system
# times in /proc before and after a wrk run of make_batch_bodies.py's varied gzip bodies
# (64 conns, default fsync durability, a 4 s warm-up first), divided by the events
# acknowledged. Run it for two builds in turn, alternating, to compare where they spend.
# Threads are named as the kernel knows them (`comm`): actix-rt|system… the HTTP workers,
# corvid-flush-N the segment writers, corvid-wal the WAL writer, and the binary's own name for
# the ingest shard.
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
# Each thread's name and its user plus system time in clock ticks.
times() {
  for task in /proc/"$SERVER"/task/*; do
    echo "$(tr ' ' _ <"$task/comm") $(awk '{print $14 + $15}' "$task/stat")"
  done
}
times >"$DATA/before"
wrk -t1 -c64 -d"${DURATION}s" "${script[@]}" >"$DATA/wrk.txt"
times >"$DATA/after"
events=$(awk '/requests in/ {n = $1} /Non-2xx/ {bad = $NF} END {print (n - bad) * 100}' "$DATA/wrk.txt")
echo "== $events events acknowledged in ${DURATION} s ($((events / DURATION)) a second)"
python3 - "$DATA/before" "$DATA/after" "$events" "$(getconf CLK_TCK)" <<'PY'
import collections, sys
def load(path):
    ticks = collections.defaultdict(int)
    for line in open(path):
        name, value = line.rsplit(" ", 1)
        ticks[name] += int(value)
    return ticks
before, after = load(sys.argv[1]), load(sys.argv[2])
events, hz = int(sys.argv[3]), int(sys.argv[4])
per_event = {name: (after[name] - before.get(name, 0)) * 1e6 / hz / max(events, 1) for name in after}
for name, us in sorted(per_event.items(), key=lambda kv: -kv[1]):
    if us > 0:
        print(f"{name:28s} {us:6.2f} µs an event")
print(f"{'all':28s} {sum(per_event.values()):6.2f} µs an event")
PY
ab_stop
