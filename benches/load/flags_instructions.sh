#!/usr/bin/env bash
# Instructions the server executes per `/flags` request of the big-customer traffic, and per
# `/_health` request beside it, counted by valgrind's callgrind: a count does not drift with
# the machine's speed the way a timing does, so two builds compare in one run each, on any
# day. It counts instructions, not time (cache misses, the kernel's sending and receiving
# are not in it), so it shows where the work is, and a timed run (flags_big_customer.sh)
# says what a change is worth.
#
# The server runs under callgrind with the big-customer flag set (20 flags of every operator
# family) and KNOWN persons seeded through /batch/ uninstrumented; then wrk drives `/_health`
# for SECS seconds, the counts are dumped, and big_customer.lua's traffic (half known users
# sending their country, half new users sending every property) drives `/flags?v=2` for SECS
# seconds. Prints the instructions per request of both, and for `/flags` the parts of the
# handler, each with what it calls. Needs valgrind (apt-get install valgrind) and wrk.
#
# Two parts count far more under valgrind than they cost: valgrind's CPU has no SHA
# instructions, so rollout hashing runs SHA-1 in software (`sha1::compress::soft`; the server
# uses the CPU's SHA extensions where it has them), and it counts a `rep stosb` memset byte by
# byte (actix clears its header index for every request it parses). Both are printed apart.
# PERSON_EXTRA=M seeds each person with M more properties no flag reads (known_persons.py).
# Usage: [KNOWN=10000] [CONNS=4] [PERSON_EXTRA=0] benches/load/flags_instructions.sh BIN [SECS, default 15]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="$1"
SECS="${2:-15}"
KNOWN="${KNOWN:-10000}"
CONNS="${CONNS:-4}"
PORT="${PORT:-18098}"
. benches/load/callgrind_lib.sh
python3 benches/load/big_customer_flags.py "$BASE" "$KEY" 20 "$DATA/edge.json" >/dev/null
python3 benches/load/known_persons.py "$BASE" "$TOKEN" "$KNOWN" "$KEY" >/dev/null
echo "{\"token\": \"$TOKEN\"}" >"$DATA/flags.json"
# The seeded events reach their segment (ingest.flush_interval, 10 s) before counting starts.
sleep 12
# Warm-up, uncounted: the snapshot, the persons' pages and each worker's buffers.
POOL=100000 wrk -t1 -c"$CONNS" -d5s -s benches/load/big_customer.lua "$BASE/flags?v=2" -- "$DATA/flags.json" "$KNOWN" >/dev/null
wrk -t1 -c"$CONNS" -d2s "$BASE/_health" >/dev/null

callgrind_control -i on "$VG" >/dev/null 2>&1
wrk -t1 -c"$CONNS" -d"${SECS}s" "$BASE/_health" >"$DATA/health.txt"
callgrind_control -d health "$VG" >/dev/null 2>&1
POOL=100000 wrk -t1 -c"$CONNS" -d"${SECS}s" -s benches/load/big_customer.lua "$BASE/flags?v=2" -- "$DATA/flags.json" "$KNOWN" >"$DATA/flags.txt"
callgrind_control -i off "$VG" >/dev/null 2>&1
kill "$VG"; wait "$VG" 2>/dev/null || true
# KEEP (optional): a directory the counts are copied to, for callgrind_annotate.
[ -z "${KEEP:-}" ] || { mkdir -p "$KEEP"; cp "$OUT"* "$KEEP"/; }

requests() { awk '/requests in/ {print $1}' "$1"; }
HEALTH=$(requests "$DATA/health.txt")
FLAGS=$(requests "$DATA/flags.txt")
# The dump taken between the two runs holds /_health (files ending .1); the final dump /flags.
sum() { cat "$@" 2>/dev/null | awk '/^totals:/ {s += $2} END {print s + 0}'; }
health_total=$(sum "$OUT".1-*)
flags_files=$(ls "$OUT"-* | grep -vE '\.[0-9]+-[0-9]+$' || true)
flags_total=$(sum $flags_files)
awk -v h="$health_total" -v nh="$HEALTH" -v f="$flags_total" -v nf="$FLAGS" 'BEGIN {
  printf "/_health  %9.0f instructions a request (%d requests)\n", h / nh, nh
  printf "/flags    %9.0f instructions a request (%d requests), %.2fx /_health\n", f / nf, nf, (f / nf) / (h / nh)
}'
echo "== /flags, per request, each part with what it calls"
for file in $flags_files; do
  callgrind_annotate --inclusive=yes --threshold=100 "$file" 2>/dev/null
done | awk -v n="$FLAGS" '
  /^ *[0-9,]+ \(/ {
    count = $1; gsub(",", "", count)
    name = $0; sub(/^ *[0-9,]+ +\([ 0-9.%]+\) +/, "", name); sub(/ \[.*$/, "", name)
    total[name] += count
  }
  END { for (f in total) printf "%9.0f  %s\n", total[f] / n, f }' |
  grep -E '(Dispatcher<T,S,B,X,U> as core::future::future::Future>::poll|InnerDispatcher<T,S,B,X,U>::poll_request|evaluate::evaluate_http::\{\{closure\}\}|Flags::decode_request|Flags>::serve::\{\{closure\}\}|corvid_flags::evaluate::evaluate|evaluate_slots|hash::hash_parts|sha1::compress::soft::compress|shapes::v2_response|__memset[a-z0-9_]*)( |$)' |
  sed -E 's/ +\?\?\?:/  /; s/\.\/string\/\.\.\/sysdeps\/x86_64\/multiarch\/[^:]*://' | sort -rn
