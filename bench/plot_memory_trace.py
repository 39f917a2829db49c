#!/usr/bin/env python3
"""Draws a memory timeline written by remat::memory_trace (the Chrome trace event format) as a PNG:
the bytes in use per tag over the step, stacked, above a strip of the layer calls coloured by phase
(forward, recomputation, backward), the peak marked.

    plot_memory_trace.py step.json step.png [--title TEXT]

Needs only the standard library and matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TAGS = ["parameters", "gradients", "optimizer state", "activations", "workspace"]
COLOURS = {"parameters": "#9ecae1", "gradients": "#6baed6", "optimizer state": "#c6dbef",
           "activations": "#fd8d3c", "workspace": "#74c476"}
PHASES = {"forward": "#3182bd", "recomputation": "#e6550d", "backward": "#31a354", "loss": "#756bb1",
          "optimizer": "#636363"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("png")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    events = json.load(open(a.trace))["traceEvents"]
    counters = [e for e in events if e.get("ph") == "C"]
    spans = [e for e in events if e.get("ph") == "X"]
    if not counters:
        raise SystemExit("no memory events in " + a.trace)
    t = [e["ts"] / 1000.0 for e in counters]
    mib = float(1 << 20)
    series = [[e["args"][tag] / mib for e in counters] for tag in TAGS]
    fig, (ax, strip) = plt.subplots(2, 1, figsize=(9, 4.8), sharex=True,
                                    gridspec_kw={"height_ratios": [6, 1]})
    ax.stackplot(t, series, labels=TAGS, colors=[COLOURS[x] for x in TAGS], step="post")
    totals = [sum(v) for v in zip(*series)]
    peak = max(range(len(totals)), key=lambda i: totals[i])
    ax.annotate(f"peak {totals[peak]:.2f} MiB", (t[peak], totals[peak]), textcoords="offset points",
                xytext=(8, -12), fontsize=8, arrowprops={"arrowstyle": "->"})
    ax.set_ylabel("in use (MiB)")
    ax.legend(loc="lower right", fontsize=7, ncol=3)
    ax.set_title(a.title or "remat memory timeline")
    ax.grid(alpha=0.3)
    for s in spans:
        strip.broken_barh([(s["ts"] / 1000.0, max(s["dur"] / 1000.0, 1e-4))], (0, 1),
                          color=PHASES.get(s["cat"], "#999999"))
    for name, colour in PHASES.items():
        strip.plot([], [], color=colour, linewidth=6, label=name)
    strip.set_yticks([])
    strip.set_xlabel("time in the step (ms)")
    strip.legend(loc="upper center", bbox_to_anchor=(0.5, -0.9), ncol=5, fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(a.png, dpi=120)
    print("wrote", a.png)


if __name__ == "__main__":
    main()
