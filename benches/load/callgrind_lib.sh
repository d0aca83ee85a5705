# Shared by the instruction-count scripts (source it with PORT set): starts the server BIN
# under valgrind's callgrind, counting nothing until `callgrind_control -i on`, one output
# file per thread, on a temp data dir at $PORT; sets BASE, DATA, OUT (the output files'
# prefix), VG (valgrind's pid), TOKEN and KEY. The server and the data dir are removed on exit.
BASE="http://127.0.0.1:$PORT"
DATA="$(mktemp -d)"
OUT="$DATA/callgrind.out"
RUST_LOG=warn valgrind --tool=callgrind --instr-atstart=no --separate-threads=yes \
  --callgrind-out-file="$OUT" "$BIN" serve --data-dir "$DATA/server" --bind "127.0.0.1:$PORT" \
  >/dev/null 2>"$DATA/valgrind.log" &
VG=$!
trap 'kill "$VG" 2>/dev/null || true; wait "$VG" 2>/dev/null || true; rm -rf "$DATA"' EXIT
for _ in $(seq 1 600); do curl -sf "$BASE/_readiness" >/dev/null && break; sleep 0.5; done
credential() {
  python3 -c "import json,sys;print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$DATA/server/credentials.json" "$1"
}
TOKEN=$(credential project_token)
KEY=$(credential personal_api_key)
