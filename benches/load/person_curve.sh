#!/usr/bin/env bash
# How /flags and the server's footprint grow with the persons it knows: for each count in
# PERSONS, a fresh server with the big-customer flag set (big_customer_flags.py) and that many
# persons seeded through /batch/ (known_persons.py), then
#   - RSS after seeding, and disk bytes per person (blocks the data dir holds: persons, their events'
#     segments and WAL, metadata);
#   - restart: the server killed (-9) and started again, seconds until /_readiness answers,
#     and seconds until every person is loaded into memory again (/metrics
#     corvid_persons_memory_complete; "-" when the budget cannot hold even their markers);
#   - /flags?v=2 as big_customer.lua drives it (half known users sending only their country,
#     half new users with every property): req/s and p99, RSS after the run.
# Writes one row per count to OUT (TSV) and draws it (curve_plot.py, matplotlib).
# Usage: [PERSONS="10000 100000 1000000 10000000"] [FLAGS=20] [CONNS=64] [OUT=dir] [CONFIG_FILE=f] benches/load/person_curve.sh [seconds per run, default 15]
# (CONFIG_FILE: a config layered over the defaults, e.g. another [memory] persons_bytes.)
# Needs: pip install matplotlib
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION="${1:-15}"
PERSONS="${PERSONS:-10000 100000 1000000 10000000}"
FLAGS="${FLAGS:-20}"
CONNS="${CONNS:-64}"
OUT="${OUT:-$(mktemp -d)}"
PORT="${PORT:-18032}"
. benches/load/build.sh
BASE="http://127.0.0.1:$PORT"
SERVER=""
DATA=""
trap 'kill -9 "$SERVER" 2>/dev/null || true; [ -n "$DATA" ] && rm -rf "$DATA"' EXIT
start() {
  RUST_LOG=warn "$BIN" serve ${CONFIG_FILE:+--config "$CONFIG_FILE"} --data-dir "$DATA" --bind "127.0.0.1:$PORT" >/dev/null 2>>"$DATA/server.log" &
  SERVER=$!
  for _ in $(seq 1 6000); do curl -sf "$BASE/_readiness" >/dev/null && return; sleep 0.01; done
  echo "the server did not start" >&2
  exit 1
}
rss_mib() { echo $(($(ps -o rss= -p "$SERVER") / 1024)); }
# Seconds (from $1, a `date +%s.%N`) until memory holds every person, or "-" after 600 s.
loaded_after() {
  for _ in $(seq 1 6000); do
    if curl -sf "$BASE/metrics" | grep -q '^corvid_persons_memory_complete 1'; then
      echo "$(date +%s.%N) - $1" | bc -l | xargs printf '%.2f'
      return
    fi
    sleep 0.1
  done
  echo "-"
}
mkdir -p "$OUT"
printf 'persons\tflags_rps\tflags_p99_ms\trss_seeded_mib\trss_after_mib\tdisk_bytes_per_person\trestart_s\tloaded_s\n' >"$OUT/persons.tsv"
for n in $PERSONS; do
  DATA="$(mktemp -d)"
  start
  KEY=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['personal_api_key'])" "$DATA/credentials.json")
  TOKEN=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['project_token'])" "$DATA/credentials.json")
  python3 benches/load/big_customer_flags.py "$BASE" "$KEY" "$FLAGS" "$DATA/edge.json" >/dev/null
  python3 benches/load/known_persons.py "$BASE" "$TOKEN" "$n" "$KEY"
  sleep 2
  seeded=$(rss_mib)
  disk=$(du -s -B1 "$DATA" | cut -f1)
  kill -9 "$SERVER"; wait "$SERVER" 2>/dev/null || true
  began=$(date +%s.%N)
  start
  restart=$(echo "$(date +%s.%N) - $began" | bc -l)
  loaded=$(loaded_after "$began")
  echo "{\"token\": \"$TOKEN\"}" >"$DATA/flags.json"
  POOL=$((DURATION * 90000)) wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s benches/load/big_customer.lua "$BASE/flags?v=2" -- "$DATA/flags.json" "$n" >"$DATA/wrk.txt"
  rps=$(awk '/^Requests\/sec/ {print $2}' "$DATA/wrk.txt")
  p99=$(python3 benches/load/wrk_sum.py flags "$DATA/wrk.txt" | sed -n 's/.*worst p99 \([0-9.]*\) ms.*/\1/p')
  after=$(rss_mib)
  echo "$n persons: $(curl -sf "$BASE/metrics" | grep '^corvid_persons_memory' | tr '\n' ' ')"
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
  per_person=$(echo "$disk / $n" | bc)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%s\n' "$n" "$rps" "$p99" "$seeded" "$after" "$per_person" "$restart" "$loaded" | tee -a "$OUT/persons.tsv"
  rm -rf "$DATA"
  DATA=""
done
python3 benches/load/curve_plot.py "$OUT/persons.tsv" "$OUT/persons.png"
echo "table: $OUT/persons.tsv; plot: $OUT/persons.png"
