#!/usr/bin/env bash
# Cluster load test: one embedded node, then three distributed nodes sharing a PostgreSQL
# (Debian's server, initdb in a temp dir, fsync on) and an S3-compatible bucket (moto's server
# from PyPI), all on this machine, driven the same way by wrk in one run:
#   1. POST /flags?v=2, 20 flags, a new distinct_id and varied person properties per request;
#   2. POST /batch/, gzipped batches of 100 events;
#   3. materialized endpoint runs (refresh=force: each run reads the stored result);
#   4. event-to-queryable: posted on the first node, read on the last.
# The same connections in total are spread evenly over the nodes (one wrk per node). Every
# process shares the two cores, so the ratio shows what the shared services cost, not a
# speed-up.
# Usage: [CONNS=c, default 48] benches/load/cluster.sh [seconds per scenario, default 15]
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION="${1:-15}"
CONNS="${CONNS:-48}"
. benches/load/build.sh

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

# ---- shared services ----
PGBIN="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)"
AS_PG=()
if [ "$(id -u)" = 0 ]; then AS_PG=(runuser -u postgres --); fi
mkdir -p "$WORK/pg" && chmod 777 "$WORK" && { [ "$(id -u)" != 0 ] || chown postgres "$WORK/pg"; }
"${AS_PG[@]}" "$PGBIN/initdb" -D "$WORK/pg" -U postgres --auth=trust >/dev/null
PG_PORT="$(free_port)"
"${AS_PG[@]}" "$PGBIN/postgres" -D "$WORK/pg" -p "$PG_PORT" -k "$WORK/pg" \
  -c listen_addresses=127.0.0.1 -c max_connections=200 >"$WORK/pg.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do "$PGBIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" && break; sleep 0.1; done
"$PGBIN/psql" -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "CREATE DATABASE corvid" >/dev/null
PG_URL="postgres://postgres@127.0.0.1:$PG_PORT/corvid"

VENV="${HOME}/.cache/corvid-bench-venv"
if [ ! -x "$VENV/bin/moto_server" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "moto[server]==5.2.5"
fi
S3_PORT="$(free_port)"
"$VENV/bin/python" -m moto.server -H 127.0.0.1 -p "$S3_PORT" >/dev/null 2>&1 &
PIDS+=($!)
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$S3_PORT/moto-api/" >/dev/null && break; sleep 0.1; done
curl -sf -XPUT "http://127.0.0.1:$S3_PORT/corvid" >/dev/null

# ---- nodes ----
# Writes a node's config: raised endpoint rate limits (one key drives all the load), plus the
# cluster section when a node id is given.
node_config() {
  local file="$1" node="${2:-}"
  cat >"$file" <<TOML
[endpoints]
inline_per_minute = 1000000000
inline_per_hour = 1000000000
materialized_per_minute = 1000000000
materialized_per_hour = 1000000000
TOML
  if [ -n "$node" ]; then
    cat >>"$file" <<TOML
[cluster]
mode = "distributed"
node_id = "$node"
[cluster.postgres]
url = "$PG_URL"
[cluster.object_store]
bucket = "corvid"
endpoint = "http://127.0.0.1:$S3_PORT"
region = "us-east-1"
access_key_id = "bench"
secret_access_key = "bench"
allow_http = true
TOML
  fi
}

# Starts a node in $WORK/<name>; sets NODE to its base URL once it is ready.
start_node() {
  local name="$1" node="${2:-}" port
  port="$(free_port)"
  mkdir -p "$WORK/$name"
  node_config "$WORK/$name.toml" "$node"
  RUST_LOG=warn "$BIN" serve --config "$WORK/$name.toml" --data-dir "$WORK/$name/data" \
    --bind "127.0.0.1:$port" >/dev/null 2>"$WORK/$name.log" &
  PIDS+=($!)
  NODE="http://127.0.0.1:$port"
  for _ in $(seq 1 300); do curl -sf "$NODE/_readiness" >/dev/null && break; sleep 0.1; done
}

# Runs one wrk per base URL at once (CONNS spread over them) and prints their sum.
# Usage: spread LABEL PATH SCRIPT [SCRIPT ARGS...]
spread() {
  local label="$1" path="$2" script="$3"; shift 3
  local per=$((CONNS / ${#BASES[@]})) outs=() i=0 pids=()
  for base in "${BASES[@]}"; do
    outs+=("$WORK/wrk-$i.txt")
    wrk -t1 -c"$per" -d"${DURATION}s" --latency -s "$script" "$base$path" -- "$@" >"$WORK/wrk-$i.txt" &
    pids+=($!)
    i=$((i + 1))
  done
  wait "${pids[@]}"
  python3 benches/load/wrk_sum.py "$label" "${outs[@]}"
}

# All four scenarios against the nodes in BASES (set up through the first one).
scenarios() {
  local first="${BASES[0]}" last="${BASES[-1]}" data="$WORK/setup-${#BASES[@]}"
  mkdir -p "$data"
  python3 benches/load/flags_setup.py "$first" "$KEY" "$TOKEN" 20 "$data/flags.json"
  python3 benches/load/make_bodies.py "$TOKEN" "$data"
  python3 benches/load/endpoints_setup.py "$first" "$KEY" "$TOKEN" "$data" >/dev/null
  sleep 3 # flag and endpoint changes reach every node's listener
  spread "/flags, 20 flags, new user per request" "/flags?v=2" benches/load/flags_users.lua "$data/flags.json"
  spread "/batch/, 100 events per request" "/batch/" benches/load/post.lua "$data/batch.json.gz" gzip
  spread "materialized endpoint run" "$(sed -n 1p "$data/paths.txt")" benches/load/post.lua "$data/materialized.json" "bearer=$KEY"
  sleep 5 # let the /batch/ backlog flush before the probes
  python3 benches/load/queryable.py "$first" "$TOKEN" "$KEY" 50 "$last"
}

credentials() {
  TOKEN=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['project_token'])" "$1")
  KEY=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['personal_api_key'])" "$1")
}

echo "== one embedded node"
start_node single
BASES=("$NODE")
credentials "$WORK/single/data/credentials.json"
scenarios
kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true

echo "== three distributed nodes (PostgreSQL, S3-compatible bucket)"
start_node n1 node-1
BASES=("$NODE")
credentials "$WORK/n1/data/credentials.json"
start_node n2 node-2
BASES+=("$NODE")
start_node n3 node-3
BASES+=("$NODE")
scenarios
