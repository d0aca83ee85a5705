#!/usr/bin/env bash
# /flags side by side with Unleash Edge, as real traffic: both servers get a new user id and
# varied person properties (country, email, plan, age, app version) in every request, with the
# same flag set (flags_setup.py for Corvid, edge_features.py translates it for Edge). Corvid
# runs first, is stopped, then Edge (offline mode, POST /api/frontend) runs on the freed
# cores; the script prints both and the ratio.
# Usage: [CONNS=c, default 64] [EDGE=path] [PACE_MS=ms HELD_CONNS=c] benches/load/flags_vs_edge.sh [N flags, default 20] [seconds, default 15]
# PACE_MS adds Corvid at a held rate below saturation (about HELD_CONNS / (PACE_MS + latency),
# HELD_CONNS defaulting to CONNS), to read its latency at a given request rate.
# EDGE defaults to unleash-edge on the PATH, else it is installed (benches/load/edge.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
FLAGS="${1:-20}"
DURATION="${2:-15}"
CONNS="${CONNS:-64}"
HELD_CONNS="${HELD_CONNS:-$CONNS}"
PORT="${PORT:-18020}"
EDGE_PORT="${EDGE_PORT:-18021}"
. benches/load/edge.sh
. benches/load/lib.sh
python3 benches/load/flags_setup.py "$BASE" "$KEY" "$TOKEN" "$FLAGS" "$DATA/flags.json"
python3 benches/load/edge_features.py "$FLAGS" "$DATA/edge.json"

echo "== Corvid: POST /flags?v=2, $FLAGS flags, a new distinct_id and varied properties per request"
measured_wrk "$DATA/corvid.txt" -t1 -c"$CONNS" -d"${DURATION}s" --latency -s benches/load/flags_users.lua "$BASE/flags?v=2" -- "$DATA/flags.json"
if [ -n "${PACE_MS:-}" ]; then
  echo "== Corvid at a held rate (each of $HELD_CONNS connections pauses ${PACE_MS} ms between requests)"
  wrk -t1 -c"$HELD_CONNS" -d"${DURATION}s" --latency -s benches/load/flags_users_paced.lua "$BASE/flags?v=2" -- "$PACE_MS" "$DATA/flags.json"
fi
kill "$SERVER"; wait "$SERVER" 2>/dev/null || true

start_edge "$DATA/edge.json"
curl -sf -XPOST "http://127.0.0.1:$EDGE_PORT/api/frontend/all" -H "Authorization: $EDGE_TOKEN" -H 'Content-Type: application/json' \
  -d '{"userId":"u1","properties":{"email":"a@corp.com","plan":"pro","age":"31","country":"US"}}' \
  | python3 -c "import json,sys; print('edge toggles:', len(json.load(sys.stdin)['toggles']))"
echo "== Unleash Edge: POST /api/frontend, $FLAGS flags, a new userId and varied properties per request"
measured_wrk "$DATA/edge.txt" -t1 -c"$CONNS" -d"${DURATION}s" --latency -s benches/load/edge_users.lua "http://127.0.0.1:$EDGE_PORT/api/frontend" -- "$EDGE_TOKEN"

if grep -q Non-2xx "$DATA/corvid.txt" "$DATA/edge.txt"; then echo "some answers were not 2xx (above)" >&2; fi
corvid=$(awk '/^Requests\/sec/ {print $2}' "$DATA/corvid.txt")
edge=$(awk '/^Requests\/sec/ {print $2}' "$DATA/edge.txt")
python3 -c "print(f'== {$FLAGS} flags: Corvid {$corvid:,.0f} req/s, Unleash Edge {$edge:,.0f} req/s, ratio {$corvid / $edge:.2f}x')"
echo "== wrk's share of the two cores: $(wrk_share "$DATA/corvid.txt") during Corvid's run, $(wrk_share "$DATA/edge.txt") during Edge's"
