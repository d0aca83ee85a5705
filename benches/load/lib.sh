# Shared by the load scripts (source it; set CONFIG_FILE to layer a config file): installs wrk if missing, builds Corvid (release),
# starts it on a temp data dir at $PORT and sets BASE, DATA, SERVER, TOKEN and KEY. The server
# and the data dir are removed on exit.
# BIN (optional): a server binary to measure instead of building this checkout (for A/B runs).
. benches/load/build.sh
BASE="http://127.0.0.1:$PORT"
DATA="$(mktemp -d)"
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; rm -rf "$DATA"' EXIT
# CONFIG_FILE (optional): a config file layered over the embedded defaults.
RUST_LOG=warn "$BIN" serve ${CONFIG_FILE:+--config "$CONFIG_FILE"} --data-dir "$DATA" --bind "127.0.0.1:$PORT" >/dev/null 2>"$DATA/server.log" &
SERVER=$!
for _ in $(seq 1 100); do curl -sf "$BASE/_readiness" >/dev/null && break; sleep 0.1; done
TOKEN=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['project_token'])" "$DATA/credentials.json")
KEY=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['personal_api_key'])" "$DATA/credentials.json")

# Runs wrk with the remaining arguments, prints its report and keeps it in $1, and keeps the
# CPU wrk itself used (user, sys, wall seconds) in $1.cpu: wrk shares the two cores. A script
# that builds its requests before the run (pooled.lua) leaves the CPU seconds that took in
# $1.init.
measured_wrk() {
  local out=$1 TIMEFORMAT='%U %S %R'
  shift
  rm -f "$out.init"
  { time WRK_INIT_CPU="$out.init" wrk "$@" >"$out" 2>"$out.err"; } 2>"$out.cpu"
  cat "$out"
  cat "$out.err" >&2
}
# wrk's share of the two cores during the run recorded in $1 (building a pooled script's
# requests before it left out).
wrk_share() {
  local init=0
  [ -f "$1.init" ] && init=$(cat "$1.init")
  awk -v init="$init" '{printf "%.0f%%", 100 * ($1 + $2 - init) / (($3 - init) * 2)}' "$1.cpu"
}
