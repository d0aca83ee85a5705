"""The query issue's three queries with DuckDB over the segments `cargo bench --bench
query_engine` generated, for the ratios in docs/PERFORMANCE.md.

DuckDB reads `$browser` from the JSON text (as Corvid would without materialized columns) and,
for reference, from the materialized column too. Prints the median of 10 runs per query.

    pip install duckdb==1.3.2 pytz
    python3 benches/load/duckdb_query.py target/bench-data/query-10000000
"""

import statistics
import sys
import time

import duckdb

root = sys.argv[1] if len(sys.argv) > 1 else "target/bench-data/query-10000000"
files = f"{root}/project=1/*/*.parquet"
con = duckdb.connect()
con.execute("SET threads TO 2")
con.execute(f"CREATE VIEW events AS SELECT * FROM read_parquet('{files}')")

queries = {
    "count_group_by_event": "SELECT event, count(*) FROM events GROUP BY event",
    "trend_30d_by_browser (JSON text)": """
        SELECT date_trunc('day', timestamp) AS d, json_extract_string(properties, '$."$browser"') AS b, count(*)
        FROM events WHERE event = '$pageview'
          AND timestamp >= TIMESTAMPTZ '2024-06-01 00:00:00+00' AND timestamp <= TIMESTAMPTZ '2024-06-30 23:59:59.999999+00'
        GROUP BY d, b""",
    "trend_30d_by_browser (column)": """
        SELECT date_trunc('day', timestamp) AS d, "properties.$browser" AS b, count(*)
        FROM events WHERE event = '$pageview'
          AND timestamp >= TIMESTAMPTZ '2024-06-01 00:00:00+00' AND timestamp <= TIMESTAMPTZ '2024-06-30 23:59:59.999999+00'
        GROUP BY d, b""",
    "distinct_users_7d": "SELECT count(DISTINCT person_id) FROM events WHERE timestamp >= TIMESTAMPTZ '2024-06-24 00:00:00+00'",
    "distinct_users_7d (approx_count_distinct)": "SELECT approx_count_distinct(person_id) FROM events WHERE timestamp >= TIMESTAMPTZ '2024-06-24 00:00:00+00'",
}

for name, sql in queries.items():
    con.execute(sql).fetchall()  # warm the OS cache and DuckDB's metadata
    times = []
    for _ in range(10):
        start = time.perf_counter()
        con.execute(sql).fetchall()
        times.append(time.perf_counter() - start)
    print(f"{name}: median {statistics.median(times) * 1000:.1f} ms")
