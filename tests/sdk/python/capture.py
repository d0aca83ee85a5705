"""Drives the official posthog-python SDK against a Corvid server.

Usage: capture.py HOST PROJECT_TOKEN TAG
Every distinct id and group key carries TAG so the Rust test can find what was sent.
Exits non-zero if the SDK reported any error.
"""
import datetime
import sys

from posthog import Posthog

host, token, tag = sys.argv[1], sys.argv[2], sys.argv[3]
errors = []


def on_error(error, items):
    errors.append(f"{error!r} ({len(items)} items)")


anon, user, alias = f"anon-{tag}", f"user-{tag}", f"alias-{tag}"
company = f"acme-{tag}"

# Batched, gzipped client: the way servers use the SDK.
client = Posthog(token, host=host, gzip=True, flush_at=3, on_error=on_error, max_retries=0)
client.capture("$pageview", distinct_id=anon, properties={"$current_url": "https://example.com/"})
client.capture("$identify", distinct_id=user, properties={"$anon_distinct_id": anon, "$set": {"email": f"{tag}@example.com"}})
client.set(distinct_id=user, properties={"plan": "pro"})
client.set_once(distinct_id=user, properties={"first_seen": "python"})
client.alias(previous_id=user, distinct_id=alias)
client.group_identify("company", company, {"name": "Acme", "employees": 42}, distinct_id=user)
client.capture("purchase", distinct_id=user, properties={"amount": 9.5}, groups={"company": company})
client.flush()
client.shutdown()

# A historical import: old timestamps, flagged batch.
history = Posthog(token, host=host, historical_migration=True, on_error=on_error, max_retries=0)
old = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=10)
for i in range(3):
    history.capture("imported", distinct_id=user, timestamp=old + datetime.timedelta(minutes=i), properties={"i": i})
history.flush()
history.shutdown()

if errors:
    print("\n".join(errors), file=sys.stderr)
    sys.exit(1)
print("ok")
