"""Evaluates flags with the official posthog-python SDK, remotely (POST /flags) and locally
(definitions from /api/feature_flag/local_evaluation), and prints both as JSON.

Usage: flags.py HOST PROJECT_TOKEN PERSONAL_API_KEY
"""
import json
import sys

from posthog import Posthog

host, token, key = sys.argv[1], sys.argv[2], sys.argv[3]
subjects = [
    {"distinct_id": f"distinct_id_{i}", "person_properties": {"email": f"user{i}@{'corp' if i % 3 == 0 else 'gmail'}.com"},
     "groups": {"company": "acme-inc"} if i % 2 == 0 else {}}
    for i in range(20)
]
flags = ["simple-flag", "multivariate-flag", "email-flag", "group-flag"]

remote = Posthog(token, host=host)
local = Posthog(token, host=host, personal_api_key=key, enable_local_evaluation=True)
local.load_feature_flags()

out = {"remote": {}, "local": {}, "payload": None, "all": None}
for s in subjects:
    for f in flags:
        kw = dict(person_properties=s["person_properties"], groups=s["groups"])
        out["remote"][f"{s['distinct_id']}/{f}"] = remote.get_feature_flag(f, s["distinct_id"], **kw)
        out["local"][f"{s['distinct_id']}/{f}"] = local.get_feature_flag(f, s["distinct_id"], only_evaluate_locally=True, **kw)
out["payload"] = remote.get_feature_flag_payload("multivariate-flag", "distinct_id_0")
out["all"] = remote.get_all_flags("distinct_id_0", person_properties=subjects[0]["person_properties"], groups=subjects[0]["groups"])
remote.shutdown()
local.shutdown()
print(json.dumps(out))
