"""Sums concurrent wrk runs (one per node): total requests/s, and the worst p50 and p99.

Usage: wrk_sum.py LABEL WRK_OUTPUT...
"""
import re
import sys

label, files = sys.argv[1], sys.argv[2:]
rate, p50, p99, errors = 0.0, 0.0, 0.0, 0


def millis(text):
    value, unit = re.match(r"([\d.]+)(us|ms|s)", text).groups()
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


for name in files:
    out = open(name).read()
    rate += float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    p50 = max(p50, millis(re.search(r"\s50%\s+(\S+)", out).group(1)))
    p99 = max(p99, millis(re.search(r"\s99%\s+(\S+)", out).group(1)))
    found = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors += int(found.group(1)) if found else 0
print(f"{label}: {rate:,.0f} req/s over {len(files)} node(s), worst p50 {p50:.2f} ms, "
      f"worst p99 {p99:.2f} ms, non-2xx {errors}")
