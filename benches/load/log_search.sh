#!/usr/bin/env bash
# Log search for ops over ENTRIES execution-log lines (default 10,000,000), Corvid against
# DuckDB over the same lines, back to back in one run.
#
# Builds Corvid and the seeder (release), creates six endpoints, stops the server and fills its
# execution log with a week of realistic run lines through the store's own writer
# (benches/support/log_seed.rs), which also writes them as CSV; restarts the server, then times
# GET …/logs/search/ over the whole week with curl (median of 10 after one warm-up) for each
# search below, and the same answer from DuckDB (the lines loaded into a native table first:
# its best case; histogram, per-endpoint summary with exact percentiles, newest 100 lines),
# printing the ratio per search.
#
# Usage: benches/load/log_search.sh [entries, default 10000000]
# Needs: pip install duckdb==1.3.2
set -euo pipefail
cd "$(dirname "$0")/../.."
ENTRIES="${1:-10000000}"
PORT="${PORT:-18006}"
TARGET="${CARGO_TARGET_DIR:-target}"
# BIN and SEED (optional): binaries to measure instead of building this checkout.
if [ -z "${BIN:-}" ] || [ -z "${SEED:-}" ]; then
  cargo build --release --quiet -p corvid -p corvid-endpoints --bins
fi
BIN="${BIN:-$TARGET/release/corvid}"
SEED="${SEED:-$TARGET/release/corvid-log-seed}"
. benches/load/lib.sh
AUTH="Authorization: Bearer $KEY"
ids=()
for i in 0 1 2 3 4 5; do
  ids+=("$(curl -sf -XPOST "$BASE/api/projects/1/endpoints/" -H "$AUTH" -H 'Content-Type: application/json' \
    -d "{\"name\": \"report_$i\", \"query\": {\"kind\": \"HogQLQuery\", \"query\": \"SELECT $i\"}}" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')")
done
kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
echo "seeding $ENTRIES lines"
/usr/bin/time -f "seeded in %e s" "$SEED" "$DATA/meta" 1 "$(IFS=,; echo "${ids[*]}")" "$ENTRIES" 7 "$DATA/logs.csv"
echo "execution log on disk: $(du -sh "$DATA/meta" | cut -f1) (sled, every table of the node)"
RUST_LOG=warn "$BIN" serve ${CONFIG_FILE:+--config "$CONFIG_FILE"} --data-dir "$DATA" --bind "127.0.0.1:$PORT" >/dev/null 2>>"$DATA/server.log" &
SERVER=$!
for _ in $(seq 1 300); do curl -sf "$BASE/_readiness" >/dev/null && break; sleep 0.1; done

AFTER=$(date -u -d '8 days ago' +%Y-%m-%dT%H:%M:%SZ)
BEFORE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
RANGE="after=$AFTER&before=$BEFORE&limit=100"
declare -A SEARCHES=(
  [all]="$RANGE"
  [errors_5xx]="$RANGE&status=5xx"
  [slow_one_endpoint]="$RANGE&endpoint=report_0&min_duration_ms=1000"
  [text_rare]="$RANGE&search=error%3DMemoryLimit"
  [text_none]="$RANGE&search=OutOfDisk"
)
ORDER=(all errors_5xx slow_one_endpoint text_rare text_none)
: >"$DATA/corvid.txt"
for name in "${ORDER[@]}"; do
  url="$BASE/api/projects/1/logs/search/?${SEARCHES[$name]}"
  total=$(curl -sf -H "$AUTH" "$url" | python3 -c 'import json,sys; print(json.load(sys.stdin)["total"])')
  times=()
  for _ in $(seq 1 10); do
    times+=("$(curl -sf -o /dev/null -w '%{time_total}' -H "$AUTH" "$url")")
  done
  median=$(printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {printf "%.1f", a[int((NR+1)/2)]*1000}')
  echo "$name $median $total" >>"$DATA/corvid.txt"
done
kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
python3 benches/load/log_search_duckdb.py "$DATA/logs.csv" "$AFTER" "$BEFORE" "${ids[0]}" >"$DATA/duckdb.txt"
echo
printf '%-20s %12s %12s %8s %12s %12s\n' search corvid_ms duckdb_ms ratio corvid_rows duckdb_rows
join <(sort "$DATA/corvid.txt") <(sort "$DATA/duckdb.txt") | while read -r name c ctotal d dtotal; do
  printf '%-20s %12s %12s %7.2fx %12s %12s\n' "$name" "$c" "$d" "$(echo "$d / $c" | bc -l)" "$ctotal" "$dtotal"
done
echo "(ratio: DuckDB's time over Corvid's; above 1 means Corvid answers faster)"
