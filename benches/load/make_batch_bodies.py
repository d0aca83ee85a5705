"""Writes varied /batch/ bodies for the capture load scripts, as real SDK traffic sends them.

Usage: make_batch_bodies.py TOKEN OUT_DIR [BODIES, default 2000] [USERS, default 100000]

Writes OUT_DIR/batches.bin (the gzipped bodies back to back) and OUT_DIR/batches.idx (each
body's byte length, one a line), which batch_bodies.lua cycles through. Each body holds 100
events of about 450 bytes:
  - half the bodies are one browser's queue (posthog-js): one distinct id and session, a walk
    through pages with clicks and autocapture between;
  - half are a server's queue (posthog-node, posthog-python): events of about 30 users;
  - distinct ids come from a pool of USERS users, skewed so some users are far more active;
  - properties vary per event (URLs, browsers, screen sizes, plans, amounts, custom keys that
    differ by event), and about one event in a hundred is an `$identify` with `$set`.
No body carries event uuids, so a body sent again is stored again rather than deduplicated.
"""
import gzip
import json
import random
import sys
import time

token, out = sys.argv[1], sys.argv[2]
bodies = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
users = int(sys.argv[4]) if len(sys.argv) > 4 else 100000
rng = random.Random(7)

BROWSERS = [("Chrome", 131), ("Safari", 18), ("Firefox", 133), ("Edge", 131), ("Chrome", 130)]
OSES = [("Mac OS X", "Desktop"), ("Windows", "Desktop"), ("iOS", "Mobile"), ("Android", "Mobile"),
        ("Linux", "Desktop")]
SCREENS = [(1920, 1080), (1440, 900), (390, 844), (412, 915), (2560, 1440), (1366, 768)]
PAGES = ["/", "/pricing", "/docs/getting-started", "/blog/launch-week", "/products/{}",
         "/cart", "/checkout", "/account/settings", "/search?q={}", "/docs/api/{}"]
REFERRERS = ["https://www.google.com/", "$direct", "https://news.ycombinator.com/",
             "https://twitter.com/", "https://duckduckgo.com/"]
PLANS = ["free", "pro", "enterprise", "trial"]
COUNTRIES = ["US", "DE", "FR", "GB", "BR", "IN", "JP", "CA", "ES", "NL"]
SERVER_EVENTS = ["order_placed", "invoice_paid", "subscription_renewed", "api_call",
                 "export_finished", "email_sent", "webhook_delivered", "report_generated"]


def user_id():
    # Skewed: a few users send most events.
    return f"user-{int(users * rng.random() ** 3):07d}"


def page_url():
    path = rng.choice(PAGES).format(rng.randint(1, 5000))
    return f"https://shop.example.com{path}"


def browser_event(distinct_id, session, device, ts):
    browser, version = device["browser"]
    os_name, device_type = device["os"]
    width, height = device["screen"]
    kind = rng.random()
    name = "$pageview" if kind < 0.4 else "$autocapture" if kind < 0.75 else "button_clicked"
    url = page_url()
    props = {
        "$current_url": url, "$host": "shop.example.com", "$pathname": url[25:],
        "$browser": browser, "$browser_version": version, "$os": os_name,
        "$device_type": device_type, "$screen_width": width, "$screen_height": height,
        "$lib": "web", "$lib_version": "1.200.2", "$session_id": session,
        "$window_id": device["window"], "$referrer": device["referrer"],
        "$insert_id": f"{rng.getrandbits(48):012x}",
    }
    if name == "$autocapture":
        props["$event_type"] = rng.choice(["click", "submit", "change"])
        props["$el_text"] = rng.choice(["Add to cart", "Sign up", "Next", "Buy now", "Search"])
    elif name == "button_clicked":
        props["button"] = rng.choice(["hero_cta", "nav_pricing", "footer_docs"])
        props["experiment_variant"] = rng.choice(["control", "test"])
    return {"event": name, "distinct_id": distinct_id, "properties": props,
            "timestamp": ts}


def server_event(ts):
    distinct_id = user_id()
    name = rng.choice(SERVER_EVENTS)
    props = {
        "$lib": rng.choice(["posthog-node", "posthog-python"]), "$lib_version": "5.70.0",
        "plan": rng.choice(PLANS), "country": rng.choice(COUNTRIES),
        "amount": round(rng.uniform(1, 900), 2), "items": rng.randint(1, 12),
        "region": rng.choice(["eu-west-1", "us-east-1", "ap-south-1"]),
        "request_id": f"{rng.getrandbits(64):016x}",
        "duration_ms": rng.randint(3, 4000), "success": rng.random() < 0.97,
    }
    if name == "api_call":
        props["endpoint"] = rng.choice(["/v1/orders", "/v1/users", "/v1/search"])
        props["status"] = rng.choice([200, 200, 200, 201, 404, 500])
    return {"event": name, "distinct_id": distinct_id, "properties": props, "timestamp": ts}


def identify(distinct_id, ts):
    return {"event": "$identify", "distinct_id": distinct_id, "timestamp": ts,
            "properties": {"$set": {"email": f"{distinct_id}@corp.com",
                                    "plan": rng.choice(PLANS),
                                    "country": rng.choice(COUNTRIES)},
                           "$lib": "web", "$lib_version": "1.200.2"}}


now = time.time()
sizes = []
raw_total = 0
with open(f"{out}/batches.bin", "wb") as data:
    for b in range(bodies):
        start = now - rng.uniform(0, 600)
        events = []
        browser = b % 2 == 0
        if browser:
            distinct_id = user_id()
            device = {"browser": rng.choice(BROWSERS), "os": rng.choice(OSES),
                      "screen": rng.choice(SCREENS), "referrer": rng.choice(REFERRERS),
                      "window": f"0193a8a0-{rng.getrandbits(16):04x}-7b8e-9c4e-6b2f6c1d2e3f"}
            session = f"0193a8a0-{rng.getrandbits(16):04x}-7c1e-8d2f-{rng.getrandbits(48):012x}"
        for i in range(100):
            ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(start + i * 0.7)) + ".000Z"
            if rng.random() < 0.01:
                events.append(identify(distinct_id if browser else user_id(), ts))
            elif browser:
                events.append(browser_event(distinct_id, session, device, ts))
            else:
                events.append(server_event(ts))
        body = json.dumps({"api_key": token, "batch": events}).encode()
        raw_total += len(body)
        packed = gzip.compress(body, compresslevel=6)
        data.write(packed)
        sizes.append(len(packed))
with open(f"{out}/batches.idx", "w") as idx:
    idx.write("\n".join(str(s) for s in sizes) + "\n")
print(f"{bodies} batch bodies: {raw_total // (bodies * 100)} bytes/event raw, "
      f"{sum(sizes) // bodies} bytes/body gzipped")
