"""Draws a cost curve's table, one panel per measure against the table's first column (log
scale): person_curve.sh's (persons stored) or events_curve.sh's (events stored).

Usage: curve_plot.py TABLE.tsv OUT.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Per table: the x axis's label, then the panels as (title, [(column, legend label)], log y).
CURVES = {
    "persons": ("persons stored", [
        ("/flags req/s", [("flags_rps", None)], False),
        ("/flags p99 (ms)", [("flags_p99_ms", None)], False),
        ("RSS (MiB)", [("rss_seeded_mib", "seeded"), ("rss_after_mib", "after /flags")], False),
        ("disk bytes per person", [("disk_bytes_per_person", None)], False),
        ("restart (s)", [("restart_s", "ready"), ("loaded_s", "persons in memory")], False),
    ]),
    "events": ("events stored", [
        ("query median (ms): Corvid solid, DuckDB dashed",
         [(f"{q}{side}", f"{q}{label}") for q in ("count", "trend", "uniq", "uniq_exact")
          for side, label in (("_ms", ""), ("_duckdb_ms", " DuckDB"))], True),
        ("capture", [("batch_events_per_s", "/batch/ events/s"), ("single_rps", "single req/s")], True),
        ("event-to-queryable p95 (ms)", [("queryable_p95_ms", None)], False),
        ("RSS (MiB)", [("rss_idle_mib", "idle"), ("rss_after_mib", "after queries")], False),
        ("disk bytes per event", [("disk_bytes_per_event", None)], False),
        ("restart to ready (s)", [("restart_s", None)], False),
    ]),
}

table, out = sys.argv[1], sys.argv[2]
rows = list(csv.DictReader(open(table), delimiter="\t"))
x_column = next(iter(rows[0]))
x_label, panels = CURVES[x_column]
fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
for ax, (title, columns, log_y) in zip(axes, panels):
    for i, (column, label) in enumerate(columns):
        points = [(int(r[x_column]), float(r[column])) for r in rows
                  if r.get(column, "-") not in ("-", "")]
        style = "--" if "duckdb" in column else "-"
        color = f"C{i // 2}" if "_ms" in column and log_y else f"C{i}"
        ax.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", color=color,
                label=label)
    if any(label for _, label in columns):
        ax.legend(fontsize=7)
    ax.set_xscale("log")
    if log_y:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(x_label)
    ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig(out, dpi=110)
