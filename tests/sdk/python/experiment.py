"""Takes part in an experiment with the official posthog-python SDK: each user gets the
experiment flag's variant (the SDK reports the exposure as `$feature_flag_called`) and buys
something, captured with the flag attached (`send_feature_flags`). A holdout flag is also
evaluated locally, from the local-evaluation definitions, and remotely.

Usage: experiment.py HOST PROJECT_TOKEN PERSONAL_API_KEY FLAG_KEY HELD_FLAG_KEY USERS
Prints {"variants": {user: variant}, "held_local": [...], "held_remote": [...]}.
"""
import json
import sys

from posthog import Posthog

host, token, key, flag, held, users = sys.argv[1:7]
errors = []


def on_error(error, items):
    errors.append(f"{error!r} ({len(items)} items)")


client = Posthog(token, host=host, on_error=on_error, max_retries=0, flush_at=50)
variants = {}
for i in range(int(users)):
    user = f"py-user-{i}"
    variant = client.get_feature_flag(flag, user)
    variants[user] = variant
    client.capture("purchase", distinct_id=user, properties={"amount": 10 + i}, send_feature_flags=True)
client.flush()

local = Posthog(token, host=host, personal_api_key=key, enable_local_evaluation=True)
local.load_feature_flags()
held_local = [local.get_feature_flag(held, f"py-user-{i}", only_evaluate_locally=True) for i in range(3)]
held_remote = [client.get_feature_flag(held, f"py-user-{i}", send_feature_flag_events=False) for i in range(3)]
client.shutdown()
local.shutdown()
if errors:
    print("\n".join(errors), file=sys.stderr)
    sys.exit(1)
print(json.dumps({"variants": variants, "held_local": held_local, "held_remote": held_remote}))
