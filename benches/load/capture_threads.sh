#!/usr/bin/env bash
# The server's CPU per single-event capture request as a big customer sends them, by thread,
# and how busy the two cores were: KNOWN persons seeded through /batch/ (known_persons.py),
# then /i/v0/e/ with half the events from known persons doing `$set` and half from new users
# (capture_known.lua, CONNS conns, as capture_ab.sh runs it). Prints the rate, the WAL's syncs,
# each thread's user plus system time in /proc divided by the requests (threads named as
# ab_lib.sh lists them) and the machine's user, system, idle and I/O-wait shares over the run
# (/proc/stat): idle left while the connections wait for the WAL's syncs is time the server
# could have used.
# Usage: [KNOWN=1000000] [CONNS=32] benches/load/capture_threads.sh BIN [seconds, default 15]
set -euo pipefail
cd "$(dirname "$0")/../.."
PORT="${PORT:-18044}"
DURATION="${2:-15}"
KNOWN="${KNOWN:-1000000}"
CONNS="${CONNS:-32}"
. benches/load/ab_lib.sh
ab_start "$1"
python3 benches/load/known_persons.py "$BASE" "$TOKEN" "$KNOWN" "$KEY" >/dev/null
ab_wal_mark
ab_threads_mark
head -1 /proc/stat >"$DATA/stat.before"
wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s benches/load/capture_known.lua "$BASE/i/v0/e/" -- "$DATA/single.json" "$KNOWN" >"$DATA/wrk.txt"
head -1 /proc/stat >"$DATA/stat.after"
requests=$(awk '/requests in/ {n = $1} /Non-2xx/ {bad = $NF} END {print n - bad}' "$DATA/wrk.txt")
echo "== $(awk '/^Requests\/sec/ {r = $2} $1 == "99%" {p = $2} END {printf "%.0f req/s, p99 %s", r, p}' "$DATA/wrk.txt"); $(ab_wal_since)"
paste "$DATA/stat.before" "$DATA/stat.after" | awk '{
  # user nice system idle iowait irq softirq steal (guest time is inside user already)
  n = NF / 2; total = 0
  for (i = 1; i <= 8; i++) { d[i] = $(i + n + 1) - $(i + 1); total += d[i] }
  printf "== the two cores: user %.0f %%, system %.0f %%, idle %.0f %%, waiting for I/O %.0f %%, stolen %.0f %%\n",
    100 * (d[1] + d[2]) / total, 100 * (d[3] + d[6] + d[7]) / total, 100 * d[4] / total, 100 * d[5] / total, 100 * d[8] / total
}'
echo "== CPU a request by thread:"
ab_threads_since "$requests"
ab_stop
