#!/usr/bin/env bash
# OAuth load test: builds Corvid (release), serves a client metadata document over TLS from a
# throwaway CA (the dev switches trust it), runs CONNS authorization flows to get that many
# refresh tokens, then drives with wrk from this machine:
#   1. refresh grants: each connection rotates its own refresh token, request after request;
#   2. bearer verification: GET /api/users/@me with a cached OAuth access token, with a cached
#      personal API key, and the unauthenticated /_health as the floor, one connection each so
#      the latency difference is the cost of authentication.
# Usage: [CONNS=32] [WORKERS=n] benches/load/oauth.sh [seconds, default 20]
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION="${1:-20}"
CONNS="${CONNS:-32}"
PORT="${PORT:-18005}"
TARGET="${CARGO_TARGET_DIR:-target}"
# A venv with trustme for the metadata server (kept between runs).
VENV="$TARGET/bench-venv"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check trustme==1.2.1
fi
CIMD_DIR="$(mktemp -d)"
mkfifo "$CIMD_DIR/ready"
"$VENV/bin/python" tests/sdk/python/cimd_server.py "$CIMD_DIR" --forever </dev/null >"$CIMD_DIR/ready" 2>/dev/null &
CIMD=$!
CIMD_PORT=$(head -n1 "$CIMD_DIR/ready" | cut -d' ' -f2)
CONFIG_FILE="$(mktemp --suffix=.toml)"
cat >"$CONFIG_FILE" <<TOML
[oauth]
dev_allow_loopback_fetch = true
dev_extra_ca_file = "$CIMD_DIR/ca.pem"
TOML
if [ -n "${WORKERS:-}" ]; then printf '[server]\nworkers = %s\n' "$WORKERS" >>"$CONFIG_FILE"; fi
. benches/load/lib.sh
trap 'kill "$SERVER" "$CIMD" 2>/dev/null || true; rm -rf "$DATA" "$CIMD_DIR" "$CONFIG_FILE"' EXIT
PASSWORD=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['password'])" "$DATA/credentials.json")
python3 benches/load/oauth_setup.py "$BASE" "$CIMD_PORT" "$CIMD_DIR/docs" "$PASSWORD" "$CONNS" "$DATA"
CLIENT_ID="https://localhost:$CIMD_PORT/bench-client.json"
ACCESS=$(cat "$DATA/access_token.txt")
echo "== refresh grants ($CONNS connections, each rotating its own token)"
wrk -t1 -c"$CONNS" -d"${DURATION}s" --latency -s benches/load/oauth_refresh.lua "$BASE/oauth/token" -- "$DATA/refresh_tokens.txt" "$CLIENT_ID"
for target in "OAuth access token|$ACCESS|/api/users/@me" "personal API key|$KEY|/api/users/@me" "no credential (floor)||/_health"; do
  IFS='|' read -r label cred path <<<"$target"
  echo "== GET $path, $label, 1 connection"
  wrk -t1 -c1 -d"${DURATION}s" --latency -s benches/load/get.lua "$BASE$path" -- "$cred"
done
