#!/usr/bin/env bash
# /flags as a big customer's traffic, side by side with Unleash Edge and the server's own
# HTTP ceiling, in one run:
#   1. Corvid with N flags cycling through every operator family (big_customer_flags.py) and
#      KNOWN persons stored with their properties (known_persons.py, through /batch/);
#   2. ROUNDS (default 3) rounds of the same server's GET /_health (the HTTP ceiling on these
#      cores), then POST /flags?v=2 with half the requests from known users sending only
#      their country and half from new users sending every property (big_customer.lua). The
#      two alternate so that the share of /_health compares rates taken minutes apart at
#      most, while the host's speed drifts; RSS after the last round;
#   4. Corvid stopped, then Unleash Edge (offline) with the same flags, every property in each
#      request (big_customer_edge.lua: its best case, it has no store).
# Prints each round's rates, p99s and share of /_health, then the means, Corvid's share of
# /_health over all rounds and its ratio to Edge.
# Usage: [KNOWN=1000000] [CONNS=64] [EDGE=path] benches/load/flags_big_customer.sh [N flags, default 20] [seconds, default 15]
# EDGE defaults to unleash-edge on the PATH, else it is installed (benches/load/edge.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
FLAGS="${1:-20}"
DURATION="${2:-15}"
KNOWN="${KNOWN:-1000000}"
CONNS="${CONNS:-64}"
# Requests built before each run (pooled.lua): enough for 90,000 req/s without one sent twice.
export POOL="${POOL:-$((DURATION * 90000))}"
PORT="${PORT:-18030}"
EDGE_PORT="${EDGE_PORT:-18031}"
. benches/load/edge.sh
. benches/load/lib.sh
python3 benches/load/big_customer_flags.py "$BASE" "$KEY" "$FLAGS" "$DATA/edge.json"
python3 benches/load/known_persons.py "$BASE" "$TOKEN" "$KNOWN" "$KEY"
echo "{\"token\": \"$TOKEN\"}" >"$DATA/flags.json"
echo "RSS with the persons stored: $(($(ps -o rss= -p "$SERVER") / 1024)) MiB"

ROUNDS="${ROUNDS:-3}"
for round in $(seq 1 "$ROUNDS"); do
  echo "== round $round: Corvid GET /_health (the HTTP ceiling)"
  measured_wrk "$DATA/health$round.txt" -t1 -c"$CONNS" -d"${DURATION}s" --latency "$BASE/_health"
  echo "== round $round: Corvid POST /flags?v=2, $FLAGS flags, half known users (country only), half new users (every property)"
  measured_wrk "$DATA/corvid$round.txt" -t1 -c"$CONNS" -d"${DURATION}s" --latency -s benches/load/big_customer.lua \
    "$BASE/flags?v=2" -- "$DATA/flags.json" "$KNOWN"
done
rss=$(($(ps -o rss= -p "$SERVER") / 1024))
kill "$SERVER"; wait "$SERVER" 2>/dev/null || true

start_edge "$DATA/edge.json"
curl -sf -XPOST "http://127.0.0.1:$EDGE_PORT/api/frontend/all" -H "Authorization: $EDGE_TOKEN" -H 'Content-Type: application/json' \
  -d '{"userId":"known-1","properties":{"email":"a@corp.com","plan":"pro","age":"31","country":"US","appVersion":"2.5.0","signedUpAt":"2026-07-01T00:00:00Z"}}' \
  | python3 -c "import json,sys; t=json.load(sys.stdin)['toggles']; print('Edge, one user who matches every condition:', sum(x['enabled'] for x in t), 'of', len(t), 'flags on')"
echo "== Unleash Edge: POST /api/frontend, $FLAGS flags, every property in each request"
measured_wrk "$DATA/edge.txt" -t1 -c"$CONNS" -d"${DURATION}s" --latency -s benches/load/big_customer_edge.lua \
  "http://127.0.0.1:$EDGE_PORT/api/frontend" -- "$EDGE_TOKEN" "$KNOWN"

if grep -q Non-2xx "$DATA"/corvid*.txt "$DATA/edge.txt"; then echo "some answers were not 2xx (above)" >&2; fi
rate() { awk '/^Requests\/sec/ {print $2}' "$1"; }
p99() { awk '$1 == "99%" {print $2}' "$1"; }
rounds=()
for round in $(seq 1 "$ROUNDS"); do
  rounds+=("$(rate "$DATA/corvid$round.txt"),$(p99 "$DATA/corvid$round.txt"),$(rate "$DATA/health$round.txt"),$(wrk_share "$DATA/corvid$round.txt")")
done
python3 - "$FLAGS" "$KNOWN" "$(rate "$DATA/edge.txt")" "$(p99 "$DATA/edge.txt")" "$rss" "$(wrk_share "$DATA/edge.txt")" "${rounds[@]}" <<'PY'
import sys
flags, known, edge, edge_p99, rss, edge_share, *rounds = sys.argv[1:]
edge = float(edge)
rows = [r.split(",") for r in rounds]
for i, (corvid, p99, health, share) in enumerate(rows, 1):
    print(f"round {i}: Corvid {float(corvid):,.0f} req/s (p99 {p99}), {100 * float(corvid) / float(health):.0f} % "
          f"of /_health ({float(health):,.0f} req/s); wrk's share of the two cores {share}")
corvid = sum(float(r[0]) for r in rows) / len(rows)
health = sum(float(r[2]) for r in rows) / len(rows)
print(f"== {flags} flags, {int(known):,} known persons, {len(rows)} rounds: Corvid {corvid:,.0f} req/s mean "
      f"(p99 {' / '.join(r[1] for r in rows)}, RSS {rss} MiB), {100 * corvid / health:.0f} % of its /_health "
      f"rate ({health:,.0f} req/s mean); Unleash Edge {edge:,.0f} req/s (p99 {edge_p99}, wrk's share {edge_share}); "
      f"ratio {corvid / edge:.2f}x Edge")
PY
