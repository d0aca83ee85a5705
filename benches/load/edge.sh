# Shared by the scripts that run Unleash Edge as the anchor (source it before lib.sh): sets
# EDGE to unleash-edge on the PATH, else installs it with
# `cargo install unleash-edge --version 20.1.0 --locked` (unless EDGE already names one), and
# defines start_edge.
EDGE_PORT="${EDGE_PORT:-18021}"
EDGE_TOKEN='*:development.corvid-bench'
if [ -z "${EDGE:-}" ]; then
  EDGE="$(command -v unleash-edge || true)"
  if [ -z "$EDGE" ]; then
    cargo install unleash-edge --version 20.1.0 --locked
    EDGE="$HOME/.cargo/bin/unleash-edge"
  fi
fi

# Starts Edge offline on EDGE_PORT with the client features in file $1 (after Corvid is
# stopped, so each has the cores to itself), sets EDGE_PID and waits until it is healthy.
start_edge() {
  RUST_LOG=warn "$EDGE" -p "$EDGE_PORT" -i 127.0.0.1 offline -b "$1" -c "$EDGE_TOKEN" -f "$EDGE_TOKEN" >/dev/null 2>"$DATA/edge.log" &
  EDGE_PID=$!
  trap 'kill "$EDGE_PID" 2>/dev/null || true; kill "$SERVER" 2>/dev/null || true; rm -rf "$DATA"' EXIT
  for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$EDGE_PORT/internal-backstage/health" >/dev/null && break; sleep 0.1; done
}
