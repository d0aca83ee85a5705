"""Creates the benchmark flag set (20 or N flags: rollouts, property filters, a multivariate
flag, a cohort) through the API and writes the /flags request body.

Usage: flags_setup.py BASE_URL PERSONAL_API_KEY PROJECT_TOKEN N OUT_FILE [groups]
With `groups`, the group type "company" is created (by a $groupidentify event) and every
fourth flag is a company-level flag: rolled out per company, on the company's properties.
"""
import json
import sys
import urllib.request

base, key, token, n, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
groups = sys.argv[6:] == ["groups"]


def post(path, body):
    req = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(),
                                 headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))


if groups:
    # Acknowledged means processed: the group type exists once this returns.
    req = urllib.request.Request(f"{base}/i/v0/e/", headers={"Content-Type": "application/json"}, data=json.dumps({
        "api_key": token, "event": "$groupidentify", "distinct_id": "bench-setup",
        "properties": {"$group_type": "company", "$group_key": "company-0", "$group_set": {"industry": "saas"}}}).encode())
    urllib.request.urlopen(req).read()
cohort = post("/api/projects/1/cohorts/", {"name": "Pros", "filters": {"properties": {"type": "OR", "values": [
    {"type": "AND", "values": [{"key": "plan", "value": "pro", "type": "person"}, {"key": "country", "value": "US", "type": "person"}]}]}}})
for i in range(n):
    kind = i % 5
    if groups and i % 4 == 3:
        filters = {"aggregation_group_type_index": 0, "groups": [{"properties": [
            {"key": "industry", "value": ["saas", "retail"], "operator": "exact", "type": "group", "group_type_index": 0},
            {"key": "employees", "value": 50, "operator": "gte", "type": "group", "group_type_index": 0}],
            "rollout_percentage": 60}]}
    elif kind == 0:
        filters = {"groups": [{"rollout_percentage": 30 + i % 60}]}
    elif kind == 1:
        filters = {"groups": [{"properties": [{"key": "email", "value": "@corp.com", "operator": "icontains", "type": "person"}], "rollout_percentage": 80}]}
    elif kind == 2:
        filters = {"groups": [{"properties": [{"key": "plan", "value": ["pro", "enterprise"], "operator": "exact", "type": "person"},
                                              {"key": "age", "value": 18, "operator": "gte", "type": "person"}]}]}
    elif kind == 3:
        filters = {"groups": [{"rollout_percentage": 100}], "multivariate": {"variants": [
            {"key": "control", "rollout_percentage": 50}, {"key": "test", "rollout_percentage": 50}]}, "payloads": {"test": "{\"x\": 1}"}}
    else:
        filters = {"groups": [{"properties": [{"key": "id", "value": cohort["id"], "type": "cohort", "operator": "in"}]}]}
    post("/api/projects/1/feature_flags/", {"key": f"flag-{i}", "filters": filters})
with open(out, "w") as f:
    body = {"token": token, "distinct_id": "user-42", "person_properties":
            {"email": "ann@corp.com", "plan": "pro", "age": 31, "country": "US"}}
    if groups:
        body["groups"] = {"company": "company-7"}
        body["group_properties"] = {"company": {"industry": "saas", "employees": 120}}
    json.dump(body, f)
