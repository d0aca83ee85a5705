#!/usr/bin/env bash
# /flags load test: builds Corvid (release), creates N flags (default 20; also run with 300)
# through the API, then drives POST /flags?v=2 using wrk from this same machine: first as real
# traffic (a new distinct_id and varied person properties per request), then with one
# repeated body.
# Usage: [CONNS=c, default 32] [PACE_MS=ms] [WITH_GROUPS=1] benches/load/flags.sh [N flags, default 20] [seconds, default 20]
# PACE_MS holds a rate below saturation (about CONNS / (PACE_MS + latency); see post_paced.lua),
# to read the latency at a given request rate rather than at the machine's limit.
# WITH_GROUPS=1 is the group-analytics variant: every fourth flag is company-level (rolled out
# per company, on its properties) and every request also names a company with its properties.
set -euo pipefail
cd "$(dirname "$0")/../.."
FLAGS="${1:-20}"
DURATION="${2:-20}"
PORT="${PORT:-18002}"
. benches/load/lib.sh
SCENARIO="a new distinct_id and varied person properties per request"
SETUP_ARGS=()
export USERS_LUA=benches/load/flags_users.lua
if [ -n "${WITH_GROUPS:-}" ]; then
  SCENARIO="$SCENARIO, in one of 100,000 companies with group properties"
  SETUP_ARGS=(groups)
  USERS_LUA=benches/load/flags_groups.lua
fi
python3 benches/load/flags_setup.py "$BASE" "$KEY" "$TOKEN" "$FLAGS" "$DATA/flags.json" "${SETUP_ARGS[@]}"
curl -sf -XPOST "$BASE/flags?v=2" -H 'Content-Type: application/json' -d @"$DATA/flags.json" | python3 -c "import json,sys; print('flags returned:', len(json.load(sys.stdin)['flags']))"
echo "== POST /flags?v=2 with $FLAGS flags, $SCENARIO"
wrk -t1 -c"${CONNS:-32}" -d"${DURATION}s" --latency -s "$USERS_LUA" "$BASE/flags?v=2" -- "$DATA/flags.json"
if [ -n "${PACE_MS:-}" ]; then
  echo "== the same at a held rate (each of the ${CONNS:-32} connections pauses ${PACE_MS} ms between requests)"
  wrk -t1 -c"${CONNS:-32}" -d"${DURATION}s" --latency -s benches/load/flags_users_paced.lua "$BASE/flags?v=2" -- "$PACE_MS" "$DATA/flags.json"
fi
echo "== POST /flags?v=2 with $FLAGS flags, one repeated body (secondary)"
if [ -n "${PACE_MS:-}" ]; then
  echo "(held rate: each of the ${CONNS:-32} connections pauses ${PACE_MS} ms between requests)"
  wrk -t1 -c"${CONNS:-32}" -d"${DURATION}s" --latency -s benches/load/post_paced.lua "$BASE/flags?v=2" -- "$PACE_MS" "$DATA/flags.json"
else
  wrk -t1 -c"${CONNS:-32}" -d"${DURATION}s" --latency -s benches/load/post.lua "$BASE/flags?v=2" -- "$DATA/flags.json"
fi
