"""Draws person_curve.sh's table: /flags req/s and p99, RSS, disk bytes per person and
restart time (to ready, and until every person is in memory) against the persons stored (log scale), one panel each.

Usage: person_curve_plot.py TABLE.tsv OUT.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

table, out = sys.argv[1], sys.argv[2]
rows = list(csv.DictReader(open(table), delimiter="\t"))
persons = [int(r["persons"]) for r in rows]
panels = [
    ("/flags req/s", "flags_rps", None),
    ("/flags p99 (ms)", "flags_p99_ms", None),
    ("RSS (MiB), seeded and after /flags", "rss_seeded_mib", "rss_after_mib"),
    ("disk bytes per person", "disk_bytes_per_person", None),
    ("restart (s): ready, and persons in memory", "restart_s", "loaded_s"),
]
fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4))
for ax, (title, first, second) in zip(axes, panels):
    labels = ("ready", "loaded") if first == "restart_s" else ("seeded", "after /flags")
    ax.plot(persons, [float(r[first]) for r in rows], marker="o", label=labels[0])
    if second:
        xs = [p for p, r in zip(persons, rows) if r.get(second, "-") not in ("-", "")]
        ys = [float(r[second]) for r in rows if r.get(second, "-") not in ("-", "")]
        ax.plot(xs, ys, marker="s", label=labels[1])
        ax.legend(fontsize=8)
    ax.set_xscale("log")
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("persons stored")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(out, dpi=110)
