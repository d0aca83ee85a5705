#!/usr/bin/env bash
# How queries, capture and the server's footprint grow with the events it stores: for each
# count in EVENTS, the data set `cargo bench --bench query_engine` generates (30 days, 500 k
# users, ~400-byte properties; generated once and kept under SETS) is put into a fresh data dir
# and compacted by the server's own compactor (event_set.sh), then
#   - disk bytes per event (the whole data dir);
#   - RSS when idle, and after the queries;
#   - HogQL count by event, a 30-day trend broken down by `$browser`, `uniq(person_id)` and
#     `uniqExact(person_id)` over 7 days: medians through the HTTP API (event_queries.py), and
#     DuckDB's over the same rows back to back (duckdb_query.py: its faster time over the
#     generated files or the server's compacted ones, and of reading `$browser` from the JSON
#     text or from its column; approx_count_distinct and count(DISTINCT));
#   - capture on top of the stored events: /batch/ (gzip, 100 events, 32 conns as capture.sh
#     probes under) events/s with
#     event-to-queryable p95 probed during that load (queryable.py), then single events with a
#     new user each (req/s, p99);
#   - restart: the server killed (-9) after the load and started again, seconds until
#     /_readiness answers.
# /flags is not on this curve: flag evaluation reads persons and cohorts, never events
# (person_curve.sh is its curve).
# Writes one row per count to OUT (TSV) and draws it (curve_plot.py, matplotlib).
# Usage: [EVENTS="1000000 10000000 100000000"] [SETS=target/bench-data] [RUNS=5] [OUT=dir] benches/load/events_curve.sh [seconds per capture run, default 15]
# Needs: pip install duckdb==1.3.2 pytz matplotlib
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION="${1:-15}"
EVENTS="${EVENTS:-1000000 10000000 100000000}"
SETS="${SETS:-target/bench-data}"
RUNS="${RUNS:-5}"
OUT="${OUT:-$(mktemp -d)}"
PORT="${PORT:-18034}"
. benches/load/build.sh
. benches/load/event_set.sh
BASE="http://127.0.0.1:$PORT"
SERVER=""
DATA=""
trap 'kill -9 "$SERVER" 2>/dev/null || true; [ -n "$DATA" ] && rm -rf "$DATA"' EXIT
start() {
  RUST_LOG="${LOG:-warn}" "$BIN" serve ${CONFIG_FILE:+--config "$CONFIG_FILE"} --data-dir "$DATA" --bind "127.0.0.1:$PORT" >/dev/null 2>>"$DATA/server.log" &
  SERVER=$!
  for _ in $(seq 1 6000); do curl -sf "$BASE/_readiness" >/dev/null && return; sleep 0.01; done
  echo "the server did not start" >&2
  exit 1
}
rss_mib() { echo $(($(ps -o rss= -p "$SERVER") / 1024)); }
field() { python3 -c "import json,sys;print(round(json.load(open(sys.argv[1]))[sys.argv[2]], 1))" "$1" "$2"; }
mkdir -p "$OUT"
printf 'events\tdisk_bytes_per_event\trss_idle_mib\trss_after_mib' >"$OUT/events.tsv"
for q in count trend uniq uniq_exact; do printf '\t%s_ms\t%s_duckdb_ms' "$q" "$q" >>"$OUT/events.tsv"; done
printf '\tbatch_events_per_s\tqueryable_p95_ms\tsingle_rps\tsingle_p99_ms\trestart_s\n' >>"$OUT/events.tsv"
for n in $EVENTS; do
  set_dir="$SETS/query-$n"
  echo "== $n events (data set $set_dir)"
  ensure_event_set "$n" "$set_dir"
  DATA="$(mktemp -d)"
  seed_event_set "$set_dir"
  disk=$(du -sb "$DATA" | cut -f1)
  start
  KEY=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['personal_api_key'])" "$DATA/credentials.json")
  TOKEN=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['project_token'])" "$DATA/credentials.json")
  sleep 2
  idle=$(rss_mib)
  python3 benches/load/event_queries.py "$BASE" "$KEY" "$RUNS" "$DATA/corvid.json"
  after=$(rss_mib)
  python3 benches/load/duckdb_query.py "$set_dir,$DATA/events" "$RUNS" "$DATA/duckdb.json"
  python3 benches/load/make_bodies.py "$TOKEN" "$DATA"
  wrk -t1 -c32 -d"${DURATION}s" --latency -s benches/load/post.lua "$BASE/batch/" -- "$DATA/batch.json.gz" gzip >"$DATA/batch.txt" &
  load=$!
  sleep 2
  python3 benches/load/queryable.py "$BASE" "$TOKEN" "$KEY" 100 | tee "$DATA/queryable.txt"
  wait "$load" || true
  batch=$(awk '/^Requests\/sec/ {printf "%.0f", $2 * 100}' "$DATA/batch.txt")
  queryable=$(sed -n 's/.*, p95 \([0-9.]*\) ms, max.*/\1/p' "$DATA/queryable.txt")
  wrk -t1 -c32 -d"${DURATION}s" --latency -s benches/load/capture_users.lua "$BASE/i/v0/e/" -- "$DATA/single.json" >"$DATA/single.txt"
  single=$(awk '/^Requests\/sec/ {printf "%.0f", $2}' "$DATA/single.txt")
  single_p99=$(python3 benches/load/wrk_sum.py capture "$DATA/single.txt" | sed -n 's/.*worst p99 \([0-9.]*\) ms.*/\1/p')
  kill -9 "$SERVER"; wait "$SERVER" 2>/dev/null || true
  began=$(date +%s.%N)
  start
  restart=$(echo "$(date +%s.%N) - $began" | bc -l)
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
  {
    printf '%s\t%s\t%s\t%s' "$n" "$(echo "$disk / $n" | bc)" "$idle" "$after"
    for q in count trend uniq uniq_exact; do
      printf '\t%s\t%s' "$(field "$DATA/corvid.json" "$q")" "$(field "$DATA/duckdb.json" "$q")"
    done
    printf '\t%s\t%s\t%s\t%s\t%.2f\n' "$batch" "$queryable" "$single" "$single_p99" "$restart"
  } | tee -a "$OUT/events.tsv"
  rm -rf "$DATA"
  DATA=""
done
python3 benches/load/curve_plot.py "$OUT/events.tsv" "$OUT/events.png"
echo "table: $OUT/events.tsv; plot: $OUT/events.png"
