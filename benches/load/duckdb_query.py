"""The query issue's queries with DuckDB over the segments `cargo bench --bench query_engine`
generated, for the ratios in docs/PERFORMANCE.md (event_queries.py runs them through Corvid).

DuckDB reads `$browser` from the JSON text (as Corvid would without materialized columns) and
from the materialized column too. `uniq` is timed as `approx_count_distinct` and `uniqExact`
as `count(DISTINCT)`. DATA_SET_DIR may list several directories holding the same rows
(comma-separated, each with `project=1/<day>/*.parquet`, such as the generated set and a
server's compacted `events` directory): each query is timed over each, and its best median
counts, so DuckDB gets whichever file layout suits it. A directory whose row count differs
from the first one's is skipped. Prints the median of RUNS runs per query; with OUT_JSON,
also writes {query name: median ms} there, where `trend` is the faster of the two trend
forms.

    pip install duckdb==1.3.2 pytz
    python3 benches/load/duckdb_query.py [DATA_SET_DIR[,DIR...]] [RUNS, default 10] [OUT_JSON]
"""

import json
import statistics
import sys
import time

import duckdb

root = sys.argv[1] if len(sys.argv) > 1 else "target/bench-data/query-10000000"
runs = int(sys.argv[2]) if len(sys.argv) > 2 else 10
out = sys.argv[3] if len(sys.argv) > 3 else None
con = duckdb.connect()
con.execute("SET threads TO 2")

MONTH = ("timestamp >= TIMESTAMPTZ '2024-06-01 00:00:00+00' "
         "AND timestamp <= TIMESTAMPTZ '2024-06-30 23:59:59.999999+00'")
WEEK = "timestamp >= TIMESTAMPTZ '2024-06-24 00:00:00+00'"
queries = {
    "count": "SELECT event, count(*) FROM events GROUP BY event",
    "trend_json": f"""
        SELECT date_trunc('day', timestamp) AS d, json_extract_string(properties, '$."$browser"') AS b, count(*)
        FROM events WHERE event = '$pageview' AND {MONTH} GROUP BY d, b""",
    "trend_column": f"""
        SELECT date_trunc('day', timestamp) AS d, "properties.$browser" AS b, count(*)
        FROM events WHERE event = '$pageview' AND {MONTH} GROUP BY d, b""",
    "uniq": f"SELECT approx_count_distinct(person_id) FROM events WHERE {WEEK}",
    "uniq_exact": f"SELECT count(DISTINCT person_id) FROM events WHERE {WEEK}",
}

medians = {}
rows = None
for directory in root.split(","):
    files = f"{directory}/project=1/*/*.parquet"
    con.execute(f"CREATE OR REPLACE VIEW events AS SELECT * FROM read_parquet('{files}')")
    n = con.execute("SELECT count(*) FROM events").fetchone()[0]
    if rows is not None and n != rows:
        print(f"{directory}: {n} rows, not {rows}: skipped")
        continue
    rows = n
    for name, sql in queries.items():
        con.execute(sql).fetchall()  # warm the OS cache and DuckDB's metadata
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            con.execute(sql).fetchall()
            times.append(time.perf_counter() - start)
        median = statistics.median(times) * 1000
        medians[name] = min(medians.get(name, median), median)
        print(f"{directory}: {name}: median {median:.1f} ms")
medians["trend"] = min(medians["trend_json"], medians["trend_column"])
if out:
    json.dump(medians, open(out, "w"))
