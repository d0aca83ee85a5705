"""Seeds the console benchmark: FLAGS flags with varied conditions and an endpoint to run.

Usage: console_setup.py BASE_URL PERSONAL_API_KEY FLAGS
"""

import json
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor

base, key, count = sys.argv[1], sys.argv[2], int(sys.argv[3])


def post(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("Authorization", "Bearer " + key)
    with urllib.request.urlopen(req) as res:
        return json.loads(res.read())


def flag(i):
    groups = [
        {"properties": [{"key": "country", "value": ["US", "DE"], "operator": "exact", "type": "person"}],
         "rollout_percentage": (i * 7) % 100},
        {"properties": [{"key": "email", "value": "@example.com", "operator": "icontains", "type": "person"}],
         "rollout_percentage": 50},
    ]
    post("/api/projects/1/feature_flags/", {"key": f"flag-{i:04d}", "name": f"Flag {i}",
                                            "filters": {"groups": groups}})


with ThreadPoolExecutor(8) as pool:
    list(pool.map(flag, range(count)))
post("/api/projects/1/endpoints/", {"name": "logged", "query": {"kind": "HogQLQuery", "query": "SELECT 1"}})
print(f"{count} flags and an endpoint made")
