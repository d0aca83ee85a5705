#!/usr/bin/env bash
# Data lifecycle at scale, on a release server with its default lifecycle settings: 10 M events
# over 60 days posted to /batch/, then
#   - a file export of every event (Parquet, zstd) against DuckDB's `COPY … TO` of the same
#     rows from the same segment files, both on this machine, back to back;
#   - the erasure of one person among the 10 M: time until hidden from queries, time until
#     physically gone (`deletion_status` completed), checked by DuckDB over the segment files;
#   - a 30-day retention drop (`event_retention_days = 30` over 60 days of events): time until
#     every dropped day has left the segments.
# Prints each figure and the DuckDB control for the machine's state.
# Usage: benches/load/lifecycle.sh [events, default 10000000]
set -euo pipefail
cd "$(dirname "$0")/../.."
EVENTS="${1:-10000000}"
PORT="${PORT:-18031}"
python3 -c "import duckdb" 2>/dev/null || pip install -q duckdb==1.3.2 pytz
. benches/load/lib.sh
python3 -u benches/load/lifecycle.py "$BASE" "$TOKEN" "$KEY" "$DATA" "$EVENTS"
