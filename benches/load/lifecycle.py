"""The data-lifecycle figures of docs/PERFORMANCE.md (run by benches/load/lifecycle.sh):
export throughput against DuckDB's COPY … TO, erasure of one person among N events, and a
30-day retention drop, on a running release server with its default lifecycle settings.

    python3 benches/load/lifecycle.py BASE TOKEN KEY DATA_DIR [EVENTS]
"""

import datetime as dt
import gzip
import http.client
import json
import os
import random
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import duckdb

base, token, key, data = sys.argv[1:5]
total = int(sys.argv[5]) if len(sys.argv) > 5 else 10_000_000
PER_BODY = 500
BODIES = 40
VICTIM_PER_BODY = 5  # in body 0 only
auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
segments = f"{data}/events/project=1/*/*.parquet"


def api(method, path, body=None):
    req = urllib.request.Request(
        f"{base}{path}", method=method, headers=auth,
        data=None if body is None else json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=600) as res:
        text = res.read()
        return json.loads(text) if text else None


def hogql(sql):
    return api("POST", "/api/projects/1/query/", {"query": {"kind": "HogQLQuery", "query": sql}})["results"]


def bodies():
    rng = random.Random(7)
    today = dt.datetime.now(dt.timezone.utc).replace(hour=12, minute=0, second=0, microsecond=0)
    names = ["$pageview", "button_clicked", "signup", "purchase", "$autocapture"]
    out = []
    for b in range(BODIES):
        events = []
        for i in range(PER_BODY):
            victim = b == 0 and i < VICTIM_PER_BODY
            day = rng.randrange(60)
            events.append({
                "event": rng.choice(names),
                "distinct_id": "victim" if victim else f"user-{rng.randrange(200_000)}",
                "timestamp": (today - dt.timedelta(days=day, seconds=rng.randrange(40_000))).isoformat(),
                "properties": {
                    "$current_url": f"https://shop.example.com/p/{rng.randrange(5000)}",
                    "$browser": rng.choice(["Chrome", "Firefox", "Safari"]),
                    "$os": rng.choice(["Mac OS X", "Windows", "Linux"]),
                    "plan": rng.choice(["free", "pro"]), "cart_value": rng.randrange(500),
                    "$session_id": f"s-{rng.randrange(1_000_000)}",
                },
            })
        out.append(gzip.compress(json.dumps({"api_key": token, "batch": events}).encode()))
    return out


def load():
    payloads = bodies()
    posts = total // PER_BODY
    host = urllib.parse.urlparse(base)
    next_post = iter(range(posts))
    lock = threading.Lock()

    def worker():
        conn = http.client.HTTPConnection(host.hostname, host.port, timeout=120)
        while True:
            with lock:
                n = next(next_post, None)
            if n is None:
                return
            while True:
                conn.request("POST", "/batch/", payloads[n % BODIES],
                             {"Content-Type": "application/json", "Content-Encoding": "gzip"})
                res = conn.getresponse()
                res.read()
                if res.status == 200:
                    break
                time.sleep(0.05)  # 503 under backpressure: try again

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - started
    print(f"loaded {posts * PER_BODY:,} events in {elapsed:.1f} s ({posts * PER_BODY / elapsed:,.0f} events/s)")
    return posts * PER_BODY


def wait(what, check, timeout=1800, step=0.25):
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if check():
            return time.perf_counter() - started
        time.sleep(step)
    raise SystemExit(f"timed out waiting for {what}")


def in_segments(sql):
    con = duckdb.connect()
    con.execute("SET threads TO 2")
    return con.execute(sql.replace("SEGMENTS", f"read_parquet('{segments}')")).fetchall()


loaded = load()
victim_events = VICTIM_PER_BODY * ((total // PER_BODY + BODIES - 1) // BODIES)
wait("every event in the segments",
     lambda: in_segments("SELECT count(*) FROM SEGMENTS")[0][0] == loaded, step=2)
assert hogql("SELECT count() FROM events")[0][0] == loaded

# Machine state: DuckDB's count by event over these segments.
con = duckdb.connect()
con.execute("SET threads TO 2")
con.execute(f"SELECT event, count(*) FROM read_parquet('{segments}') GROUP BY event").fetchall()
controls = []
for _ in range(5):
    t = time.perf_counter()
    con.execute(f"SELECT event, count(*) FROM read_parquet('{segments}') GROUP BY event").fetchall()
    controls.append(time.perf_counter() - t)
controls.sort()
print(f"control: DuckDB count() by event over {loaded:,} events: median {controls[2] * 1000:.0f} ms")

# Export: Corvid's file export of every event against DuckDB's COPY of the same rows.
now = dt.datetime.now(dt.timezone.utc)
started = time.perf_counter()
run = api("POST", "/api/environments/1/file_download_batch_exports", {
    "model": "events", "file": {"format": "Parquet", "compression": "zstd"},
    "data_interval_start": (now - dt.timedelta(days=1)).isoformat(),
    "data_interval_end": (now + dt.timedelta(minutes=1)).isoformat(),
})["id"]
status = {}


def export_done():
    global status
    status = api("GET", f"/api/environments/1/file_download_batch_exports/{run}")
    return status["status"] != "Running"


corvid_s = wait("the export", export_done, step=0.1)
assert status["status"] == "Completed", status
rows = status["records_completed"]
print(f"export: Corvid {rows:,} events in {corvid_s:.2f} s = {rows / corvid_s:,.0f} events/s "
      f"({status['bytes_exported'] / 1e6:.0f} MB Parquet zstd)")
with tempfile.TemporaryDirectory() as out:
    target = os.path.join(out, "copy.parquet")
    t = time.perf_counter()
    con.execute(f"""COPY (SELECT uuid, timestamp, created_at AS _inserted_at, created_at, event, properties,
                         distinct_id, '' AS elements_chain, person_properties, person_id
                  FROM read_parquet('{segments}'))
                  TO '{target}' (FORMAT parquet, COMPRESSION zstd)""")
    duck_s = time.perf_counter() - t
    print(f"export: DuckDB COPY … TO {loaded:,} events in {duck_s:.2f} s = {loaded / duck_s:,.0f} events/s "
          f"({os.path.getsize(target) / 1e6:.0f} MB)")
print(f"export ratio: Corvid {(rows / corvid_s) / (loaded / duck_s):.2f}× DuckDB's rate")

# Erasure of one person among them.
t0 = time.perf_counter()
answer = api("POST", "/api/projects/1/persons/bulk_delete/", {"distinct_ids": ["victim"], "delete_events": True})
assert answer["persons_deleted"] == 1, answer
hidden = wait("the person's events hidden",
              lambda: hogql("SELECT count() FROM events WHERE distinct_id = 'victim'")[0][0] == 0, step=0.05)
hidden_at = time.perf_counter() - t0
gone = wait("deletion_status completed",
            lambda: api("GET", "/api/projects/1/persons/deletion_status/?status=completed")["count"] == 1, step=0.5)
gone_at = time.perf_counter() - t0
left = in_segments("SELECT count(*) FROM SEGMENTS WHERE distinct_id = 'victim'")[0][0]
print(f"erasure of one person ({victim_events:,} events) among {loaded:,}: hidden after {hidden_at:.2f} s, "
      f"gone from every segment (deletion_status completed) after {gone_at:.1f} s; rows left in the files: {left}")

# Retention: keep 30 of the 60 days.
before = in_segments("SELECT count(*) FROM SEGMENTS")[0][0]
t0 = time.perf_counter()
api("PATCH", "/api/projects/1/", {"event_retention_days": 30})
drops = {}


def dropped():
    global drops
    drops = api("GET", "/api/projects/1/retention_drops/?limit=1000")
    return drops["count"] >= 30


wait("30 days dropped", dropped, step=0.5)
dropped_at = time.perf_counter() - t0
events_dropped = sum(d["events"] for d in drops["results"])
after = in_segments("SELECT count(*) FROM SEGMENTS")[0][0]
print(f"retention drop of 30 days ({events_dropped:,} events): done after {dropped_at:.1f} s "
      f"(segments held {before:,} events, now {after:,})")
