# Shared by query.sh and events_curve.sh (source it): puts a data set that
# `cargo bench --bench query_engine` generated into a server's data dir as a long-running server
# would hold it. The caller defines `start` (starts the server on $DATA, waits until it is ready,
# sets SERVER) and sets DATA.

# Generates the data set of $1 events into $2 unless it is complete: the bench's setup writes
# it, and a filter that names no benchmark skips the measurements.
ensure_event_set() {
  [ -f "$2/_complete" ] && return
  CORVID_BENCH_EVENTS="$1" CORVID_BENCH_DATA="$2" cargo bench --quiet --bench query_engine -- only-generate >/dev/null
}

# Copies the data set in $1 into $DATA's project 1 and lets the server's own compactor bring
# every segment to the current layout (sorted by event and time, promoted property columns);
# the original is never touched. The first start creates the project (id 1) and its keys; the
# events go in while the server is stopped. Compaction runs a pass every second and is done
# when the server reports its work, or when no file has changed for 30 s (a data set already
# in the current layout has nothing to rewrite). Leaves the server stopped.
seed_event_set() {
  start
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
  mkdir -p "$DATA/events" && cp -r "$1/project=1" "$DATA/events/"
  printf '[ingest]\ncompaction_interval = "1s"\ncompaction_grace = "1s"\n' >"$DATA/compact.toml"
  CONFIG_FILE="$DATA/compact.toml" LOG=info start
  echo "compacting the copy (the server's own compactor)..."
  local last="" stable=0 now
  for _ in $(seq 1 3600); do
    grep -q "property-column compaction" "$DATA/server.log" && break
    now="$(ls -l "$DATA/events/project=1"/* | md5sum)"
    if [ "$now" = "$last" ]; then stable=$((stable + 2)); else stable=0; last="$now"; fi
    [ "$stable" -ge 30 ] && break
    sleep 2
  done
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
}
