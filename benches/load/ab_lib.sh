# Shared by the A/B load scripts (source it after setting PORT): each run starts a given build
# on a fresh data dir and stops it again.
#   ab_start BIN  starts BIN on a new temp data dir at $PORT; sets DATA, SERVER, TOKEN, KEY and
#                 writes the load bodies (make_bodies.py) into DATA
#   ab_stop       stops the server and removes its data dir, then waits for the removal to
#                 reach the disk (on a disk mounted with `discard` it delays the next run's
#                 fsyncs otherwise)
#   ab_order N A B  prints the two builds in the order round N runs them: A first in odd
#                 rounds, B first in even ones. With /batch/ the build run first in a round was
#                 ahead in every round of both orders (by 5-13 %), so only an even number of
#                 rounds, or their means, compares two builds.
#   ab_record BIN X  remembers figure X of a run of BIN; ab_means prints each build's mean
#   ab_wal_mark   remembers the server's WAL sync histogram (/metrics)
#   ab_wal_since  prints the WAL syncs since the mark: how many, their mean, and how many took
#                 over 10 ms and over 50 ms (a request waits for the sync under way, then its own)
#   ab_threads_mark  remembers each server thread's user plus system time (/proc)
#   ab_threads_since N  prints each thread's CPU since the mark divided by N (events or
#                 requests), then the server's total. Threads are named as the kernel knows them
#                 (`comm`): actix-rt|system… the HTTP workers, corvid-flush-N the segment
#                 writers, corvid-wal the WAL writer, corvid-persons the person committer,
#                 fjall:worker the person store's, and the binary's own name the ingest shard.
BASE="http://127.0.0.1:$PORT"
SERVER=""
DATA=""
trap 'kill "$SERVER" 2>/dev/null || true; [ -n "$DATA" ] && rm -rf "$DATA"; rm -f "$AB_FIGURES"' EXIT
ab_start() {
  DATA="$(mktemp -d)"
  RUST_LOG=warn "$1" serve --data-dir "$DATA" --bind "127.0.0.1:$PORT" >/dev/null 2>"$DATA/server.log" &
  SERVER=$!
  for _ in $(seq 1 100); do curl -sf "$BASE/_readiness" >/dev/null && break; sleep 0.1; done
  TOKEN=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['project_token'])" "$DATA/credentials.json")
  KEY=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['personal_api_key'])" "$DATA/credentials.json")
  python3 benches/load/make_bodies.py "$TOKEN" "$DATA" >/dev/null
}
ab_stop() {
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
  rm -rf "$DATA"
  DATA=""
  sync
  sleep "${AB_SETTLE_SECONDS:-5}"
}
ab_order() {
  if [ $(($1 % 2)) -eq 1 ]; then echo "$2" "$3"; else echo "$3" "$2"; fi
}
AB_FIGURES="$(mktemp)"
ab_record() {
  echo "$1 $2" >>"$AB_FIGURES"
}
ab_means() {
  awk '{ s[$1] += $2; n[$1]++; if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 } }
    END { for (i = 1; i <= k; i++) printf "%s: mean %.0f over %d runs\n", order[i], s[order[i]] / n[order[i]], n[order[i]] }' "$AB_FIGURES"
}
ab_wal_metrics() {
  curl -s -H "Authorization: Bearer $KEY" "$BASE/metrics" | grep '^corvid_wal_fsync_duration_seconds'
}
ab_wal_mark() {
  ab_wal_metrics >"$DATA/wal_syncs.before"
}
ab_wal_since() {
  ab_wal_metrics >"$DATA/wal_syncs.after"
  paste "$DATA/wal_syncs.before" "$DATA/wal_syncs.after" | awk '
    { d = $4 - $2 }
    /_count/ { n = d }
    /_sum/ { s = d }
    /le="0.01"/ { u10 = d }
    /le="0.05"/ { u50 = d }
    END { printf "WAL syncs %d, mean %.0f us, over 10 ms %d, over 50 ms %d", n, (n ? s / n * 1e6 : 0), n - u10, n - u50 }'
}
# Each server thread's name and its user plus system time in clock ticks.
ab_thread_times() {
  for task in /proc/"$SERVER"/task/*; do
    echo "$(tr ' ' _ <"$task/comm") $(awk '{print $14 + $15}' "$task/stat")"
  done
}
ab_threads_mark() {
  ab_thread_times >"$DATA/threads.before"
}
ab_threads_since() {
  ab_thread_times >"$DATA/threads.after"
  python3 - "$DATA/threads.before" "$DATA/threads.after" "$1" "$(getconf CLK_TCK)" <<'PY'
import collections, sys
def load(path):
    ticks = collections.defaultdict(int)
    for line in open(path):
        name, value = line.rsplit(" ", 1)
        ticks[name] += int(value)
    return ticks
before, after = load(sys.argv[1]), load(sys.argv[2])
units, hz = int(sys.argv[3]), int(sys.argv[4])
per_unit = {name: (after[name] - before.get(name, 0)) * 1e6 / hz / max(units, 1) for name in after}
for name, us in sorted(per_unit.items(), key=lambda kv: -kv[1]):
    if us > 0:
        print(f"{name:28s} {us:6.2f} µs each")
print(f"{'all':28s} {sum(per_unit.values()):6.2f} µs each")
PY
}
