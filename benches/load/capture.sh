#!/usr/bin/env bash
# Capture load test: builds Corvid (release), starts it on a temp data dir with default
# (fsync) durability, and drives it with wrk from this same machine:
#   1. /batch/ with gzipped batches of 100 events (~500 B each)
#   2. single events on /i/v0/e/: a new distinct_id per request; half from KNOWN persons
#      (seeded first through /batch/ by known_persons.py) doing `$set`, half new; then one
#      repeated body
#   3. event-to-queryable latency probes while /batch/ load runs
# Usage: [SINGLE_CONNS=c, default 32] [KNOWN=n, default 1000000] benches/load/capture.sh [seconds per scenario, default 20]
# (SINGLE_CONNS: connections of the single-event scenarios; KNOWN=0 skips the known users.)
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION="${1:-20}"
PORT="${PORT:-18000}"
KNOWN="${KNOWN:-1000000}"

. benches/load/lib.sh
python3 benches/load/make_bodies.py "$TOKEN" "$DATA"
if [ "$KNOWN" -gt 0 ]; then
  python3 benches/load/known_persons.py "$BASE" "$TOKEN" "$KNOWN" "$KEY"
fi

echo "== /batch/, gzip, 100 events per request (events/s = requests/s x 100)"
wrk -t1 -c64 -d"${DURATION}s" --latency -s benches/load/post.lua "$BASE/batch/" -- "$DATA/batch.json.gz" gzip

# Each scenario is measured on its own: first wait until the /batch/ backlog is in segments
# (the shards flush it within flush_interval), so the flushers' catch-up does not run during
# the single-event measurement. The third scenario measures capture and flushing together.
settle() {
  for _ in $(seq 1 120); do
    pending=$(curl -sf -H "Authorization: Bearer $KEY" "$BASE/_internal/ingest" \
      | python3 -c "import json,sys;print(json.load(sys.stdin)['pending_events'])")
    [ "$pending" = "0" ] && return
    sleep 0.5
  done
  echo "backlog still pending after 60 s: $pending events"
}
settle
echo "== /i/v0/e/, one event per request, a new distinct_id and varied properties each (persons created)"
measured_wrk "$DATA/users.txt" -t1 -c"${SINGLE_CONNS:-32}" -d"${DURATION}s" --latency -s benches/load/capture_users.lua "$BASE/i/v0/e/" -- "$DATA/single.json"
echo "(wrk's share of the two cores: $(wrk_share "$DATA/users.txt"))"
settle
if [ "$KNOWN" -gt 0 ]; then
  echo "== /i/v0/e/, one event per request, half from $KNOWN known persons doing \$set, half from new users"
  measured_wrk "$DATA/known.txt" -t1 -c"${SINGLE_CONNS:-32}" -d"${DURATION}s" --latency -s benches/load/capture_known.lua "$BASE/i/v0/e/" -- "$DATA/single.json" "$KNOWN"
  echo "(wrk's share of the two cores: $(wrk_share "$DATA/known.txt"))"
  settle
fi
echo "== /i/v0/e/, one event per request, one repeated body (secondary)"
wrk -t1 -c"${SINGLE_CONNS:-32}" -d"${DURATION}s" --latency -s benches/load/post.lua "$BASE/i/v0/e/" -- "$DATA/single.json"

echo "== event-to-queryable under /batch/ load"
wrk -t1 -c32 -d"$((DURATION + 10))s" -s benches/load/post.lua "$BASE/batch/" -- "$DATA/batch.json.gz" gzip >/dev/null &
LOAD=$!
sleep 2
python3 benches/load/queryable.py "$BASE" "$TOKEN" "$KEY" 200
wait "$LOAD" || true
