"""Seeds events and creates two endpoints for the endpoint load test.

- `per-browser`: materialized SQL with one variable (`ev`), run with refresh=force so every
  request reads the materialized result (never the results cache, never raw events).
- `by-event`: an inline (not materialized) SQL endpoint, run with refresh=cache.

Usage: endpoints_setup.py <base_url> <personal_api_key> <project_token> <out_dir>
"""

import json
import sys
import time
import urllib.request

base, key, token, out = sys.argv[1:5]


def call(method, path, body=None, auth=True):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if auth:
        req.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(req, timeout=120) as res:
        return json.load(res) if res.status != 204 else None


browsers = ["Chrome", "Safari", "Firefox", "Edge", "Opera"]
for chunk in range(20):
    batch = [
        {"event": f"event_{i % 10}", "distinct_id": f"user_{i % 5000}",
         "properties": {"$browser": browsers[i % 5], "amount": i % 100}}
        for i in range(chunk * 5000, (chunk + 1) * 5000)
    ]
    call("POST", "/batch/", {"api_key": token, "batch": batch}, auth=False)

project = call("GET", "/api/projects/")["results"][0]["id"]
env = f"/api/environments/{project}"
call("POST", f"{env}/insight_variables/", {"name": "ev", "type": "String"})
call("POST", f"{env}/endpoints/", {
    "name": "per-browser", "is_materialized": True,
    "query": {"kind": "HogQLQuery", "query":
              "SELECT properties.$browser AS browser, count() AS c, sum(toFloat(properties.amount)) AS total "
              "FROM events WHERE event = {variables.ev} GROUP BY browser ORDER BY c DESC"}})
call("POST", f"{env}/endpoints/", {
    "name": "by-event", "is_materialized": False,
    "query": {"kind": "HogQLQuery", "query": "SELECT event, count() AS c FROM events GROUP BY event ORDER BY event"}})
for _ in range(600):
    status = call("GET", f"{env}/endpoints/per-browser/materialization_status/")
    if status.get("status") == "Completed":
        break
    time.sleep(0.2)
else:
    raise SystemExit(f"materialization did not complete: {status}")

materialized = {"variables": {"ev": "event_3"}, "refresh": "force"}
cached = {}
first = call("POST", f"{env}/endpoints/per-browser/run", materialized)
assert first["endpoint_materialized"] is True, first
print("materialized rows:", len(first["results"]))
call("POST", f"{env}/endpoints/by-event/run", cached)
second = call("POST", f"{env}/endpoints/by-event/run", cached)
assert second["is_cached"] is True, second
with open(f"{out}/materialized.json", "w") as f:
    json.dump(materialized, f)
with open(f"{out}/cached.json", "w") as f:
    json.dump(cached, f)
with open(f"{out}/paths.txt", "w") as f:
    f.write(f"{env}/endpoints/per-browser/run\n{env}/endpoints/by-event/run\n")
