"""Writes the request bodies the capture load test posts.

batch.json.gz: a /batch/ body of 100 events of ~500 bytes each, gzipped (what posthog-node sends).
single.json:   one /i/v0/e/ event.
"""
import gzip
import json
import sys

token, out = sys.argv[1], sys.argv[2]
events = []
for i in range(100):
    events.append({
        "event": "$pageview" if i % 3 == 0 else "button_clicked",
        "distinct_id": f"user-{i % 37}",
        "properties": {
            "$current_url": f"https://shop.example.com/products/{i}?ref=newsletter",
            "$browser": "Chrome", "$browser_version": 131, "$os": "Mac OS X",
            "$device_type": "Desktop", "$lib": "posthog-node", "$lib_version": "5.70.0",
            "$session_id": "0193a8a0-47c1-7b8e-9c4e-6b2f6c1d2e3f",
            "plan": "pro", "cart_value": 129.5, "items": 3,
            "$referrer": "https://www.google.com/", "$screen_width": 1920,
        },
    })
batch = json.dumps({"api_key": token, "batch": events}).encode()
with open(f"{out}/batch.json.gz", "wb") as f:
    f.write(gzip.compress(batch, compresslevel=6))
single = json.dumps({"api_key": token, "event": "$pageview", "distinct_id": "user-1",
                     "properties": events[0]["properties"]}).encode()
with open(f"{out}/single.json", "wb") as f:
    f.write(single)
print(f"batch: {len(batch)} bytes raw, {len(gzip.compress(batch))} gzipped, "
      f"{len(batch) // 100} bytes/event; single: {len(single)} bytes")
