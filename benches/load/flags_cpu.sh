#!/usr/bin/env bash
# `/flags` as a big customer against the same server's `/_health`, and the server's own CPU a
# request of each (from /proc, user and system): the rate ratio the 70 % goal names, and a
# cost that moves less with wrk's share of the two cores. 20 flags of the big-customer set,
# KNOWN persons seeded through /batch/, big_customer.lua's traffic, 64 conns, SECS seconds each.
# Run it for two builds in turn (BIN) and compare rounds taken back to back.
# Usage: benches/load/flags_cpu.sh BIN [KNOWN, default 100000] [SECS, default 10]
set -euo pipefail
cd "$(dirname "$0")/../.."
export BIN="$1"
KNOWN="${2:-100000}"
SECS="${3:-10}"
PORT="${PORT:-18050}"
CONNS=64
. benches/load/lib.sh
python3 benches/load/big_customer_flags.py "$BASE" "$KEY" 20 "$DATA/edge.json" >/dev/null
python3 benches/load/known_persons.py "$BASE" "$TOKEN" "$KNOWN" "$KEY" >/dev/null
echo "{\"token\": \"$TOKEN\"}" >"$DATA/flags.json"
cpu_ticks() { awk '{print $14 + $15}' "/proc/$SERVER/stat"; }
# Warm-up: the flag snapshot and the persons' pages.
POOL=300000 wrk -t1 -c$CONNS -d3s -s benches/load/big_customer.lua "$BASE/flags?v=2" -- "$DATA/flags.json" "$KNOWN" >/dev/null
start=$(cpu_ticks)
wrk -t1 -c$CONNS -d"${SECS}s" "$BASE/_health" >"$DATA/health.txt"
before=$(cpu_ticks)
POOL=$((SECS * 90000)) wrk -t1 -c$CONNS -d"${SECS}s" -s benches/load/big_customer.lua "$BASE/flags?v=2" -- "$DATA/flags.json" "$KNOWN" >"$DATA/flags.txt"
after=$(cpu_ticks)
health=$(awk '/^Requests\/sec/ {print $2}' "$DATA/health.txt")
flags=$(awk '/^Requests\/sec/ {print $2}' "$DATA/flags.txt")
requests=$(awk '/requests in/ {print $1}' "$DATA/flags.txt")
health_requests=$(awk '/requests in/ {print $1}' "$DATA/health.txt")
ticks=$(getconf CLK_TCK)
awk -v h="$health" -v f="$flags" -v n="$requests" -v c=$((after - before)) -v hn="$health_requests" \
  -v hc=$((before - start)) -v t="$ticks" 'BEGIN {
  printf "/_health %.0f req/s   /flags %.0f req/s   %.1f %% of /_health   server %.2f us a /flags request, %.2f us a /_health one\n",
    h, f, 100 * f / h, c * 1e6 / t / n, hc * 1e6 / t / hn
}'
grep -E "Non-2xx|Socket errors" "$DATA/flags.txt" || true
