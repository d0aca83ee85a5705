"""Writes the benchmark flag set of flags_setup.py in Unleash's client-features format, for
Unleash Edge in offline mode (the anchor of benches/load/flags_vs_edge.sh).

The same five kinds, flag for flag: a gradual rollout; an email-contains filter with an 80 %
rollout; plan in (pro, enterprise) and age >= 18; a 50/50 multivariate flag with a payload;
and membership of "plan = pro and country = US" (a cohort in Corvid, a segment in Unleash).

Usage: edge_features.py N OUT_FILE
"""
import json
import sys

n, out = int(sys.argv[1]), sys.argv[2]


def rollout(percentage, flag, constraints=(), segments=()):
    return {"name": "flexibleRollout", "constraints": list(constraints), "segments": list(segments),
            "parameters": {"rollout": str(percentage), "stickiness": "default", "groupId": flag}}


features = []
for i in range(n):
    key, kind = f"flag-{i}", i % 5
    variants = []
    if kind == 0:
        strategies = [rollout(30 + i % 60, key)]
    elif kind == 1:
        strategies = [rollout(80, key, [{"contextName": "email", "operator": "STR_CONTAINS",
                                          "values": ["@corp.com"], "caseInsensitive": True}])]
    elif kind == 2:
        strategies = [rollout(100, key, [
            {"contextName": "plan", "operator": "IN", "values": ["pro", "enterprise"]},
            {"contextName": "age", "operator": "NUM_GTE", "value": "18"}])]
    elif kind == 3:
        strategies = [rollout(100, key)]
        variants = [{"name": "control", "weight": 500, "weightType": "variable", "stickiness": "default"},
                    {"name": "test", "weight": 500, "weightType": "variable", "stickiness": "default",
                     "payload": {"type": "json", "value": "{\"x\": 1}"}}]
    else:
        strategies = [rollout(100, key, segments=[1])]
    features.append({"name": key, "type": "release", "enabled": True, "project": "default",
                     "stale": False, "strategies": strategies, "variants": variants,
                     "impressionData": False})

segments = [{"id": 1, "constraints": [
    {"contextName": "plan", "operator": "IN", "values": ["pro"]},
    {"contextName": "country", "operator": "IN", "values": ["US"]}]}]
with open(out, "w") as f:
    json.dump({"version": 2, "features": features, "segments": segments}, f)
