#!/usr/bin/env bash
# Instructions the server executes per /batch/ event, by thread, counted by valgrind's
# callgrind: a count does not drift with the machine's speed the way a timing does, so two
# builds compare in one run each, on any day. It counts instructions, not time (memory waits,
# the kernel and the disk are not in it), so it shows where work is, and a timed run
# (batch_ab.sh) says what a change is worth.
#
# The server runs under callgrind uninstrumented while WARM of make_batch_bodies.py's varied
# gzip bodies are posted (most of their persons then exist, as in a long run) and flushed,
# then instrumented while K more are posted and their segment is flushed (each wait is the
# default ingest.flush_interval, 10 s, plus SETTLE seconds). Prints each busy thread's instructions per posted event with the
# function it runs, and the flusher's per row it wrote (rows counted as calls of the walk for
# the materialized columns). Needs valgrind (apt-get install valgrind).
# Usage: [WARM=1000] [SETTLE=8] benches/load/batch_instructions.sh BIN [K, default 300]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="$1"
K="${2:-300}"
WARM="${WARM:-1000}"
PORT="${PORT:-18097}"
. benches/load/callgrind_lib.sh
python3 benches/load/make_batch_bodies.py "$TOKEN" "$DATA" $((WARM + K)) >/dev/null

# Posts bodies [FIRST, FIRST + N) of the generated file over four keep-alive connections.
post() {
  python3 - "$PORT" "$DATA" "$1" "$2" <<'PY'
import http.client, sys, threading
port, data, first, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
blob = open(f"{data}/batches.bin", "rb").read()
bodies, at = [], 0
for size in (int(line) for line in open(f"{data}/batches.idx")):
    bodies.append(blob[at:at + size]); at += size
part = bodies[first:first + n]
def send(mine):
    conn = http.client.HTTPConnection("127.0.0.1", port)
    for body in mine:
        conn.request("POST", "/batch/", body=body,
                     headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        answer = conn.getresponse(); answer.read()
        assert answer.status == 200, answer.status
threads = [threading.Thread(target=send, args=(part[i::4],)) for i in range(4)]
[t.start() for t in threads]; [t.join() for t in threads]
PY
}

post 0 "$WARM"
# The warm-up's events reach their segment before counting starts.
sleep $((10 + ${SETTLE:-8}))
callgrind_control -i on "$VG" >/dev/null 2>&1
post "$WARM" "$K"
sleep $((10 + ${SETTLE:-8}))
callgrind_control -i off "$VG" >/dev/null 2>&1
kill "$VG"; wait "$VG" 2>/dev/null || true

EVENTS=$((K * 100))
echo "== instructions per event, $EVENTS events posted (after $((WARM * 100)) uncounted)"
for file in "$OUT"-*; do
  total=$(awk '/^totals:/ {print $2}' "$file")
  [ "${total:-0}" -gt $((EVENTS * 100)) ] || continue
  listing=$(callgrind_annotate --inclusive=yes --tree=calling "$file" 2>/dev/null)
  role=$(grep -m1 -oE 'Flusher::run|wal_loop|IngestShard::process|write_persons|h1::dispatcher::Dispatcher' <<<"$listing" \
    || grep -m1 -oE '(corvid|fjall|lsm_tree|sled|actix)[a-z_]*::[A-Za-z_:]+' <<<"$listing" || echo other)
  line="$(awk -v r="$role" -v t="$total" -v e="$EVENTS" 'BEGIN {printf "%-32s %8.0f", r, t / e}')"
  rows=$(grep -m1 -E '> +\?\?\?:corvid_kernel::json::WantedKeys::values_of_checked \(' <<<"$listing" \
    | sed -E 's/.*\(([0-9,]+)x\).*/\1/' | tr -d , || true)
  if [ -n "$rows" ] && [ "$rows" -gt 0 ]; then
    line="$line   ($(awk -v t="$total" -v n="$rows" 'BEGIN {printf "%.0f", t / n}') per row written, $rows rows)"
  fi
  echo "$line"
done
