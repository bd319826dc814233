#!/usr/bin/env python3
"""Plots the latency distributions of `sandlot bench platform` (results.json -> PNG).

Usage: bench_plot.py results.json latency.png
One panel per section (time to interactive, cycle, bursts, exec); each contender's
samples as an empirical CDF on a log time axis, so medians and tails compare at
a glance.
"""
import json
import sys

try:
    import matplotlib
except ImportError:
    sys.exit(
        "bench_plot.py: no plot: this python3 has no matplotlib; "
        "`apt-get install python3-matplotlib` (or `pip install matplotlib`), then run it again"
    )

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        res = json.load(f)
    sections = [
        ("tti", "time to interactive, sequential"),
        ("cycle", "create + exec /bin/true + delete, sequential"),
        ("burst", "time to interactive, concurrent bursts"),
        ("exec", "exec round trip on a live sandbox"),
    ]
    present = [(k, t) for k, t in sections if any(r["section"] == k for r in res["rows"])]
    if not present:
        print("no latency rows in", sys.argv[1], file=sys.stderr)
        return 1
    fig, axes = plt.subplots(len(present), 1, figsize=(9, 3.6 * len(present)), squeeze=False)
    for ax, (key, title) in zip(axes[:, 0], present):
        for r in res["rows"]:
            if r["section"] != key or not r["samples_ms"]:
                continue
            xs = sorted(r["samples_ms"])
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=f'{r["name"]} (p50 {r["p50_ms"]:.1f} ms)')
        ax.set_xscale("log")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of requests")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f'sandlot bench platform: {res.get("machine", "")}', fontsize=9)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
