"""Times console pages as a signed-in admin: 200 sequential GETs each, p50 and p95.

Usage: console_pages.py BASE_URL CREDENTIALS_JSON
"""

import http.cookiejar
import json
import re
import sys
import time
import urllib.parse
import urllib.request

base, creds_path = sys.argv[1], sys.argv[2]
creds = json.load(open(creds_path))
jar = http.cookiejar.CookieJar()
opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
page = opener.open(base + "/login").read().decode()
csrf = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
form = urllib.parse.urlencode({"email": creds["email"], "password": creds["password"],
                               "csrf_token": csrf, "next": "/console"}).encode()
opener.open(base + "/login", data=form).read()

first = json.loads(urllib.request.urlopen(urllib.request.Request(
    base + "/api/projects/1/feature_flags/?limit=1",
    headers={"Authorization": "Bearer " + creds["personal_api_key"]})).read())["results"][0]["id"]
pages = [
    ("overview", "/console"),
    ("flags (1,000)", "/console/projects/1/flags"),
    ("flags, search", "/console/projects/1/flags?q=flag-09"),
    ("one flag", f"/console/projects/1/flags/{first}"),
    ("one flag, evaluated", f"/console/projects/1/flags/{first}?distinct_id=someone"),
    ("endpoints", "/console/projects/1/endpoints"),
    ("endpoint (logs, usage)", "/console/projects/1/endpoints/logged"),
    ("endpoint, log search", "/console/projects/1/endpoints/logged?search=cache%3Dhit&hours=24"),
    ("activity", "/console/projects/1/activity"),
    ("live events", "/console/projects/1/events"),
    ("webhooks", "/console/projects/1/webhooks"),
    ("persons, find", "/console/projects/1/persons?distinct_id=someone"),
    ("team", "/console/team"),
    ("API keys, OAuth clients", "/console/keys"),
]
worst = 0.0
for name, path in pages:
    times = []
    for _ in range(200):
        started = time.perf_counter()
        with opener.open(base + path) as res:
            assert res.status == 200, (path, res.status)
            res.read()
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    p50, p95 = times[len(times) // 2], times[int(len(times) * 0.95) - 1]
    worst = max(worst, p95)
    print(f"{name:28s} p50 {p50:7.1f} ms   p95 {p95:7.1f} ms")
print(f"worst p95: {worst:.1f} ms (goal ≤ 100 ms)")
