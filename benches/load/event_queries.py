"""The query issue's queries through Corvid's HTTP API (`POST /api/projects/{id}/query/`) over
the data set `cargo bench --bench query_engine` generates: median and best of RUNS warm runs
each, plus a tiny query (one minute of data) that shows the fixed cost of a query.
With OUT_JSON, also writes {query name: median ms} there (events_curve.sh reads it).

Usage: event_queries.py BASE_URL PERSONAL_API_KEY [RUNS, default 10] [OUT_JSON]
"""
import json
import statistics
import sys
import time
import urllib.request

base, key = sys.argv[1], sys.argv[2]
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 10
out = sys.argv[4] if len(sys.argv) > 4 else None
auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
projects = urllib.request.Request(f"{base}/api/projects/", headers=auth)
project = json.load(urllib.request.urlopen(projects))["results"][0]["id"]
queries = {
    "count": {"kind": "HogQLQuery", "query": "SELECT event, count() FROM events GROUP BY event"},
    "trend": {
        "kind": "TrendsQuery", "series": [{"kind": "EventsNode", "event": "$pageview"}],
        "interval": "day", "dateRange": {"date_from": "2024-06-01", "date_to": "2024-06-30"},
        "breakdownFilter": {"breakdown": "$browser", "breakdown_type": "event"}},
    "uniq": {"kind": "HogQLQuery", "query":
             "SELECT uniq(person_id) FROM events WHERE timestamp >= toDateTime('2024-06-24 00:00:00')"},
    "uniq_exact": {"kind": "HogQLQuery", "query":
                   "SELECT uniqExact(person_id) FROM events WHERE timestamp >= toDateTime('2024-06-24 00:00:00')"},
    "tiny": {"kind": "HogQLQuery", "query":
             "SELECT count() FROM events WHERE timestamp >= toDateTime('2024-06-30 23:59:00')"},
}
labels = {
    "count": "count() GROUP BY event", "trend": "trend 30d daily by $browser",
    "uniq": "uniq(person_id) 7d", "uniq_exact": "uniqExact(person_id) 7d",
    "tiny": "tiny (last minute)",
}
medians = {}
for name, query in queries.items():
    body = json.dumps({"query": query}).encode()

    def run():
        req = urllib.request.Request(f"{base}/api/projects/{project}/query/", data=body,
                                     headers=auth, method="POST")
        return json.load(urllib.request.urlopen(req, timeout=600))

    first = run()  # warms the OS cache and the footer cache
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    medians[name] = statistics.median(times)
    rows = first.get("results") or []
    print(f"{labels[name]}: median {medians[name]:.1f} ms, best {min(times):.1f} ms ({len(rows)} rows)")
if out:
    json.dump(medians, open(out, "w"))
