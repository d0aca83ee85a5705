# Shared by the load scripts (source it): installs wrk if missing and builds Corvid (release),
# setting BIN, unless BIN already names a server binary to measure (for A/B runs).
if ! command -v wrk >/dev/null; then
  echo "installing wrk (Debian package)"; apt-get update -qq && apt-get install -y -qq wrk
fi
if [ -z "${BIN:-}" ]; then
  cargo build --release --quiet
  BIN="${CARGO_TARGET_DIR:-target}/release/corvid"
fi
