"""The big-customer flag set: N flags cycling through every operator family, created in
Corvid through the API and written in Unleash's client-features format for Unleash Edge
(offline mode), flag for flag with the same meaning.

The twelve kinds, by `i % 12`:
  0 gradual rollout                     Edge: flexibleRollout
  1 country exact in (US, DE)           IN
  2 email icontains "@corp.com"         STR_CONTAINS, case-insensitive
  3 email regex "@(corp|shop)\\.(com|io)$"   STR_ENDS_WITH ("@corp.com", "@shop.io"): the same set
  4 age > 30 (numeric)                  NUM_GT
  5 app_version semver > 2.4.0          SEMVER_GT
  6 signed_up_at after 2026-06-01       DATE_AFTER (absolute)
  7 signed_up_at before -30d (relative) DATE_BEFORE, the date 30 days back computed now
  8 a static cohort of 1,000 known ids  userId IN (the same ids)
  9 a dynamic cohort: plan = pro and country = US   a segment
 10 depends on another flag being on (the kind-1 flag before it)   dependencies
 11 multivariate, three variants with JSON payloads, for plan in (pro, enterprise)   variants

Persons carry email, plan, age, country, app_version and signed_up_at (known_persons.py
seeds them; the wrk scripts send them for new users).

Usage: big_customer_flags.py BASE_URL PERSONAL_API_KEY N EDGE_OUT_FILE
"""
import datetime
import json
import sys
import urllib.request

base, key, n, edge_out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
STATIC_MEMBERS = [f"known-{k}" for k in range(1000)]
RELATIVE_DAYS = 30


def call(path, body, content_type="application/json"):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"{base}{path}", data=data, headers={
        "Authorization": f"Bearer {key}", "Content-Type": content_type})
    return json.load(urllib.request.urlopen(req))


def person(key_, operator, value):
    return {"key": key_, "value": value, "operator": operator, "type": "person"}


static = call("/api/projects/1/cohorts/?name=Early%20customers",
              ("distinct_id\n" + "\n".join(STATIC_MEMBERS) + "\n").encode(), "text/csv")
dynamic = call("/api/projects/1/cohorts/", {"name": "US pros", "filters": {"properties": {
    "type": "OR", "values": [{"type": "AND", "values": [
        person("plan", "exact", "pro"), person("country", "exact", "US")]}]}}})

relative_cutoff = (datetime.datetime.now(datetime.timezone.utc)
                   - datetime.timedelta(days=RELATIVE_DAYS)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
PAYLOADS = {"control": {"layout": "list"}, "grid": {"layout": "grid", "columns": 3},
            "carousel": {"layout": "carousel", "autoplay": True}}


def rollout(percentage, flag, constraints=(), segments=()):
    return {"name": "flexibleRollout", "constraints": list(constraints), "segments": list(segments),
            "parameters": {"rollout": str(percentage), "stickiness": "default", "groupId": flag}}


def constraint(field, operator, values=None, value=None, ci=False):
    c = {"contextName": field, "operator": operator, "caseInsensitive": ci, "inverted": False}
    if values is not None:
        c["values"] = values
    if value is not None:
        c["value"] = value
    return c


ids = {}
features = []
for i in range(n):
    flag, kind = f"flag-{i}", i % 12
    rollout_pct = 50 + (i * 7) % 50
    variants, dependencies, multivariate, payloads = [], [], None, {}
    if kind == 0:
        props, edge = [], []
        rollout_pct = 20 + i % 70
    elif kind == 1:
        props, edge = [person("country", "exact", ["US", "DE"])], [constraint("country", "IN", ["US", "DE"])]
    elif kind == 2:
        props = [person("email", "icontains", "@corp.com")]
        edge = [constraint("email", "STR_CONTAINS", ["@corp.com"], ci=True)]
    elif kind == 3:
        props = [person("email", "regex", r"@(corp|shop)\.(com|io)$")]
        edge = [constraint("email", "STR_ENDS_WITH", ["@corp.com", "@shop.io"])]
    elif kind == 4:
        props, edge = [person("age", "gt", 30)], [constraint("age", "NUM_GT", value="30")]
    elif kind == 5:
        props = [person("app_version", "semver_gt", "2.4.0")]
        edge = [constraint("appVersion", "SEMVER_GT", value="2.4.0")]
    elif kind == 6:
        props = [person("signed_up_at", "is_date_after", "2026-06-01")]
        edge = [constraint("signedUpAt", "DATE_AFTER", value="2026-06-01T00:00:00.000Z")]
    elif kind == 7:
        props = [person("signed_up_at", "is_date_before", f"-{RELATIVE_DAYS}d")]
        edge = [constraint("signedUpAt", "DATE_BEFORE", value=relative_cutoff)]
    elif kind == 8:
        props = [{"key": "id", "value": static["id"], "type": "cohort", "operator": "in"}]
        edge = [constraint("userId", "IN", STATIC_MEMBERS)]
    elif kind == 9:
        props = [{"key": "id", "value": dynamic["id"], "type": "cohort", "operator": "in"}]
        edge = []
    elif kind == 10:
        parent = f"flag-{i - 9}" if i >= 9 else None
        props = ([{"key": str(ids[parent]), "type": "flag", "operator": "flag_evaluates_to",
                   "value": True}] if parent else [])
        edge = []
        if parent:
            dependencies = [{"feature": parent, "enabled": True}]
    else:
        props = [person("plan", "exact", ["pro", "enterprise"])]
        edge = [constraint("plan", "IN", ["pro", "enterprise"])]
        multivariate = {"variants": [{"key": "control", "rollout_percentage": 34},
                                     {"key": "grid", "rollout_percentage": 33},
                                     {"key": "carousel", "rollout_percentage": 33}]}
        payloads = {k: json.dumps(v) for k, v in PAYLOADS.items()}
        variants = [{"name": k, "weight": w, "weightType": "variable", "stickiness": "default",
                     "payload": {"type": "json", "value": json.dumps(PAYLOADS[k])}}
                    for k, w in (("control", 340), ("grid", 330), ("carousel", 330))]
    filters = {"groups": [{"properties": props, "rollout_percentage": rollout_pct}]}
    if multivariate:
        filters["multivariate"] = multivariate
        filters["payloads"] = payloads
    created = call("/api/projects/1/feature_flags/", {"key": flag, "name": f"Flag {i}", "filters": filters})
    ids[flag] = created["id"]
    segments = [1] if kind == 9 else []
    features.append({"name": flag, "type": "release", "enabled": True, "project": "default",
                     "stale": False, "strategies": [rollout(rollout_pct, flag, edge, segments)],
                     "variants": variants, "dependencies": dependencies, "impressionData": False})

segments = [{"id": 1, "constraints": [constraint("plan", "IN", ["pro"]), constraint("country", "IN", ["US"])]}]
with open(edge_out, "w") as f:
    json.dump({"version": 2, "features": features, "segments": segments}, f)
print(f"{n} flags (every operator family) made; Edge's copy in {edge_out}")
