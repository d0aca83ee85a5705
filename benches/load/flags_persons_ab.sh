#!/usr/bin/env bash
# /flags as a big customer with few and with many known persons, for one or two server builds:
# seeds SMALL and LARGE persons once each (with the first build; big_customer_flags.py,
# known_persons.py), then for each round, each build and each size restarts the server on that
# data dir after a clean stop, waits until every person is loaded into memory (as far as
# memory.persons_bytes holds them), drives /flags?v=2 with big_customer.lua and prints req/s,
# p99, RSS, the persons read from disk per blocking-pool trip, and the persons memory holds.
# Usage: [SMALL=10000] [LARGE=10000000] [ROUNDS=3] benches/load/flags_persons_ab.sh BIN_A [BIN_B] [seconds per run, default 15]
set -euo pipefail
cd "$(dirname "$0")/../.."
BINS=("$1")
DURATION=15
if [ $# -ge 2 ] && [ -x "$2" ]; then BINS+=("$2"); DURATION="${3:-15}"; else DURATION="${2:-15}"; fi
SMALL="${SMALL:-10000}"
LARGE="${LARGE:-10000000}"
ROUNDS="${ROUNDS:-3}"
PORT="${PORT:-18038}"
BASE="http://127.0.0.1:$PORT"
SERVER=""
ROOT="$(mktemp -d)"
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; rm -rf "$ROOT"' EXIT
start() { # BIN DATA
  RUST_LOG=warn "$1" serve --data-dir "$2" --bind "127.0.0.1:$PORT" >/dev/null 2>>"$2/server.log" &
  SERVER=$!
  for _ in $(seq 1 600); do curl -sf "$BASE/_readiness" >/dev/null && return; sleep 0.1; done
  echo "server did not start"; exit 1
}
stop() { kill "$SERVER"; wait "$SERVER" 2>/dev/null || true; SERVER=""; }
for n in "$SMALL" "$LARGE"; do
  mkdir -p "$ROOT/$n"
  start "${BINS[0]}" "$ROOT/$n"
  KEY=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['personal_api_key'])" "$ROOT/$n/credentials.json")
  TOKEN=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['project_token'])" "$ROOT/$n/credentials.json")
  python3 benches/load/big_customer_flags.py "$BASE" "$KEY" 20 "$ROOT/$n/edge.json" >/dev/null
  python3 benches/load/known_persons.py "$BASE" "$TOKEN" "$n" "$KEY"
  echo "{\"token\": \"$TOKEN\"}" >"$ROOT/$n/flags.json"
  stop
done
for round in $(seq 1 "$ROUNDS"); do
  for bin in "${BINS[@]}"; do
    for n in "$SMALL" "$LARGE"; do
      start "$bin" "$ROOT/$n"
      for _ in $(seq 1 3000); do
        curl -sf "$BASE/metrics" | grep -q '^corvid_persons_memory_complete 1' && break
        sleep 0.1
      done
      POOL=$((DURATION * 90000)) wrk -t1 -c64 -d"${DURATION}s" --latency -s benches/load/big_customer.lua "$BASE/flags?v=2" -- "$ROOT/$n/flags.json" "$n" >"$ROOT/wrk.txt"
      rss=$(($(ps -o rss= -p "$SERVER") / 1024))
      curl -sf "$BASE/metrics" >"$ROOT/metrics.txt"
      per_trip=$(awk '/^corvid_persons_disk_reads_total/ {r=$2} /^corvid_persons_disk_read_batches_total/ {b=$2} END {if (b > 0) printf "%.1f", r / b; else print "-"}' "$ROOT/metrics.txt")
      held=$(awk '/^corvid_persons_memory_held/ {h=$2} /^corvid_persons_memory_on_disk/ {d=$2} /^corvid_persons_memory_bytes/ {b=$2} END {printf "%d held, %d on disk, %.0f MiB", h, d, b / 1048576}' "$ROOT/metrics.txt")
      echo "round $round, $bin, $n persons: $(awk '/^Requests\/sec/ {r = $2} $1 == "99%" {p = $2} END {printf "%.0f req/s, p99 %s", r, p}' "$ROOT/wrk.txt"), RSS $rss MiB, disk reads per trip $per_trip, persons in memory: $held"
      stop
    done
  done
done
