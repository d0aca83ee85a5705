"""Finds what a capture server is doing when a request is slow.

Sends one single-event capture request at a time (a new distinct id each, 10 ms apart) while
other load runs, and samples every thread of the server every 5 ms: its state (R running,
S sleeping, D waiting for the disk) and, when not running, the system call it is in. For each
probe slower than the threshold, prints which of the server's own threads were running or
waiting for the disk meanwhile, with the system call number (75 fdatasync, 74 fsync, 1 write,
277 sync_file_range on x86-64).

Usage: stall_probe.py BASE TOKEN SECONDS SERVER_PID [threshold ms, default 40]
"""

import collections
import http.client
import json
import os
import sys
import threading
import time
import uuid

base, token, seconds, pid = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
threshold = float(sys.argv[5]) / 1000 if len(sys.argv) > 5 else 0.04
host, port = base.replace("http://", "").split(":")
stop = time.time() + seconds
probes = []
samples = []


def probe():
    conn = http.client.HTTPConnection(host, int(port))
    while time.time() < stop:
        body = json.dumps({"api_key": token, "event": "probe", "distinct_id": str(uuid.uuid4()),
                           "properties": {"$set": {"probe": 1}}})
        started = time.time()
        conn.request("POST", "/i/v0/e/", body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        answer.read()
        probes.append((started, time.time() - started, answer.status))
        time.sleep(0.01)


def sample():
    tasks = f"/proc/{pid}/task"
    while time.time() < stop:
        now = time.time()
        threads = []
        for tid in os.listdir(tasks):
            try:
                name = open(f"{tasks}/{tid}/comm").read().strip()
                state = open(f"{tasks}/{tid}/stat").read().rsplit(")", 1)[1].split()[0]
                call = "-" if state == "R" else open(f"{tasks}/{tid}/syscall").read().split()[0]
            except OSError:
                continue
            threads.append((name, state, call))
        samples.append((now, threads))
        time.sleep(0.005)


workers = [threading.Thread(target=probe), threading.Thread(target=sample)]
for w in workers:
    w.start()
for w in workers:
    w.join()

latencies = sorted(p[1] for p in probes)
print(f"probes {len(latencies)}, p50 {latencies[len(latencies) // 2] * 1e3:.1f} ms, "
      f"p99 {latencies[int(len(latencies) * 0.99)] * 1e3:.1f} ms, max {latencies[-1] * 1e3:.1f} ms")
first = probes[0][0]
for started, took, status in probes:
    if took < threshold:
        continue
    print(f"slow probe at {started - first:.2f} s: {took * 1e3:.0f} ms (status {status})")
    window = [threads for at, threads in samples if started <= at <= started + took]
    seen = collections.Counter(t for threads in window for t in threads if t[1] in "RD")
    for (name, state, call), count in seen.most_common():
        print(f"    {name:18s} {state} syscall {call:4s} in {count / max(1, len(window)) * 100:3.0f} % of samples")
