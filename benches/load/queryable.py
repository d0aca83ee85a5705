"""Event-to-queryable latency: post one event with a unique distinct id, then poll the events
API until it is returned. Prints the median and p95 over N probes (run while load is applied),
and the same of the capture acknowledgement alone.
READ_BASE_URL (optional) is another node to read from (across a cluster).

Usage: queryable.py BASE_URL PROJECT_TOKEN PERSONAL_API_KEY [N] [READ_BASE_URL]
"""
import datetime
import json
import statistics
import sys
import time
import urllib.parse
import urllib.request
import uuid

base, token, key = sys.argv[1], sys.argv[2], sys.argv[3]
n = int(sys.argv[4]) if len(sys.argv) > 4 else 100
read_base = sys.argv[5] if len(sys.argv) > 5 else base
latencies = []
acks = []
for _ in range(n):
    did = f"probe-{uuid.uuid4()}"
    body = json.dumps({"api_key": token, "event": "probe", "distinct_id": did}).encode()
    start = time.monotonic()
    since = (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=5)).isoformat()
    urllib.request.urlopen(urllib.request.Request(f"{base}/i/v0/e/", data=body, headers={"Content-Type": "application/json"}))
    acks.append(time.monotonic() - start)
    while True:
        req = urllib.request.Request(f"{read_base}/api/projects/1/events/?distinct_id={did}&limit=1&after={urllib.parse.quote(since)}", headers={"Authorization": f"Bearer {key}"})
        if json.load(urllib.request.urlopen(req))["results"]:
            break
        if time.monotonic() - start > 30:
            raise SystemExit("event not visible after 30 s")
        time.sleep(0.005)
    latencies.append(time.monotonic() - start)
latencies.sort()
acks.sort()
print(f"event-to-queryable over {n} probes: median {statistics.median(latencies) * 1000:.1f} ms, "
      f"p95 {latencies[int(0.95 * (n - 1))] * 1000:.1f} ms, max {latencies[-1] * 1000:.1f} ms; "
      f"of which the capture acknowledgement: median {statistics.median(acks) * 1000:.1f} ms, "
      f"p95 {acks[int(0.95 * (n - 1))] * 1000:.1f} ms")
