"""DuckDB's side of benches/load/log_search.sh: the same searches over the same lines.

Loads the seeder's CSV into a native DuckDB table (not timed: DuckDB's best case), then answers
each search as Corvid's `…/logs/search/` does, in three statements: the histogram per 6-hour
bucket (count, errors, exact p50/p95/p99 duration), the same per endpoint, and the newest 100
lines. Prints `<search> <median ms of 10 after one warm-up> <lines matched>` per search.

    python3 benches/load/log_search_duckdb.py <csv> <after> <before> <busiest endpoint id>
"""

import statistics
import sys
import time
from datetime import datetime

import duckdb

csv, after, before, endpoint = sys.argv[1:5]
after_us = int(datetime.fromisoformat(after.replace("Z", "+00:00")).timestamp() * 1_000_000)
before_us = int(datetime.fromisoformat(before.replace("Z", "+00:00")).timestamp() * 1_000_000)
# The bucket Corvid picks for an 8-day range (about 60 buckets, rounded up to 6 hours).
BUCKET_US = 6 * 3600 * 1_000_000

con = duckdb.connect()
con.execute("SET threads TO 2")
con.execute(
    f"""CREATE TABLE logs AS SELECT * FROM read_csv('{csv}', header = true, columns = {{
        'ts_us': 'BIGINT', 'endpoint': 'UUID', 'level': 'VARCHAR', 'status': 'SMALLINT',
        'duration_ms': 'INTEGER', 'message': 'VARCHAR'}})"""
)

base = f"ts_us > {after_us} AND ts_us < {before_us}"
searches = {
    "all": base,
    "errors_5xx": f"{base} AND status BETWEEN 500 AND 599",
    "slow_one_endpoint": f"{base} AND endpoint = '{endpoint}' AND duration_ms >= 1000",
    "text_rare": f"{base} AND message ILIKE '%error=MemoryLimit%'",
    "text_none": f"{base} AND message ILIKE '%OutOfDisk%'",
}
# A text search can also be written as a case-insensitive regular expression; DuckDB is timed
# both ways and the faster counts.
alternatives = {
    "text_rare": f"{base} AND regexp_matches(message, '(?i)error=MemoryLimit')",
    "text_none": f"{base} AND regexp_matches(message, '(?i)OutOfDisk')",
}


def answer(where):
    tally = """count(*) AS n, count(*) FILTER (WHERE level = 'ERROR' OR status >= 500) AS errors,
               quantile_disc(duration_ms, [0.5, 0.95, 0.99]) AS latency"""
    con.execute(f"SELECT ts_us // {BUCKET_US} AS b, {tally} FROM logs WHERE {where} GROUP BY b").fetchall()
    per_endpoint = con.execute(f"SELECT endpoint, {tally} FROM logs WHERE {where} GROUP BY endpoint").fetchall()
    con.execute(f"SELECT * FROM logs WHERE {where} ORDER BY ts_us DESC LIMIT 100").fetchall()
    return sum(row[1] for row in per_endpoint)


def median_ms(where):
    total = answer(where)
    times = []
    for _ in range(10):
        started = time.perf_counter()
        answer(where)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), total


for name, where in searches.items():
    ms, total = median_ms(where)
    if name in alternatives:
        ms = min(ms, median_ms(alternatives[name])[0])
    print(f"{name} {ms:.1f} {total}")
