"""Seeds N known persons through capture, as an app identifying its users does: gzipped
/batch/ bodies of 1,000 `$identify` events, each person `known-<k>` with `$set` of the
properties the big-customer flags read (email, plan, age, country, app_version,
signed_up_at), on 4 connections. A person's country is COUNTRIES[k % 10], so a request of a
known user can send it (big_customer.lua). Waits until every batch is acknowledged.
With PERSON_EXTRA=M (default 0) each person also gets M properties of the kind posthog-js
stores on every person and no flag of the set reads ($initial_browser, $initial_referrer,
$geoip_city_name, ... with varied values), as real persons carry.

Usage: [PERSON_EXTRA=M] known_persons.py BASE_URL PROJECT_TOKEN N
"""
import datetime
import gzip
import json
import os
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

base, token, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
key = sys.argv[4] if len(sys.argv) > 4 else None
BATCH = 1000
COUNTRIES = ["US", "DE", "FR", "GB", "BR", "IN", "JP", "CA", "ES", "NL"]
DOMAINS = ["corp.com", "gmail.com", "example.org", "mail.de", "shop.io"]
PLANS = ["free", "pro", "enterprise", "trial"]
START = datetime.datetime(2025, 1, 1, tzinfo=datetime.timezone.utc)
EXTRA = int(os.environ.get("PERSON_EXTRA", "0"))
EXTRA_KEYS = ["$initial_browser", "$initial_browser_version", "$initial_os", "$initial_os_version",
              "$initial_device_type", "$initial_current_url", "$initial_pathname",
              "$initial_referrer", "$initial_referring_domain", "$initial_utm_source",
              "$initial_utm_medium", "$initial_utm_campaign", "$initial_gclid",
              "$initial_screen_height", "$initial_screen_width", "$geoip_city_name",
              "$geoip_country_code", "$geoip_subdivision_1_name", "$geoip_time_zone",
              "$geoip_latitude", "$geoip_longitude", "$browser", "$os", "$current_url"]


def extra(k, h):
    """EXTRA properties no flag reads: text, numbers and URLs varying by person."""
    out = {}
    for i in range(EXTRA):
        key = EXTRA_KEYS[i] if i < len(EXTRA_KEYS) else f"$initial_custom_{i}"
        v = (h >> (i % 24)) % 1000
        out[key] = (v if i % 3 == 1 else
                    f"https://shop.example.com/p/{v}?ref={k % 97}" if i % 3 == 2 else
                    f"{key[1:]}-{v}")
    return out


def properties(k):
    h = (k * 2654435761) % 4294967296
    return {
        **extra(k, h),
        "email": f"u{h}@{DOMAINS[h % len(DOMAINS)]}",
        "plan": PLANS[h % len(PLANS)],
        "age": 16 + h % 60,
        "country": COUNTRIES[k % len(COUNTRIES)],
        "app_version": f"2.{h % 10}.{h % 7}",
        "signed_up_at": (START + datetime.timedelta(hours=h % 16000)).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def post(first):
    events = [{"event": "$identify", "distinct_id": f"known-{k}",
               "properties": {"$set": properties(k)}}
              for k in range(first, min(first + BATCH, n))]
    body = gzip.compress(json.dumps({"api_key": token, "batch": events}).encode())
    req = urllib.request.Request(f"{base}/batch/", data=body, headers={
        "Content-Type": "application/json", "Content-Encoding": "gzip"})
    for attempt in range(20):
        try:
            urllib.request.urlopen(req).read()
            return
        except urllib.error.HTTPError as e:
            if e.code != 503 or attempt == 19:
                raise
            time.sleep(0.2)


started = time.time()
with ThreadPoolExecutor(4) as pool:
    list(pool.map(post, range(0, n, BATCH)))
acknowledged = time.time() - started
if key:
    last = urllib.request.Request(f"{base}/api/projects/1/persons/?distinct_id=known-{n - 1}",
                                  headers={"Authorization": f"Bearer {key}"})
    while not json.load(urllib.request.urlopen(last))["results"]:
        time.sleep(0.2)
print(f"{n} known persons seeded: acknowledged in {acknowledged:.1f} s, readable in {time.time() - started:.1f} s")
