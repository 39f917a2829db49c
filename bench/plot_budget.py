#!/usr/bin/env python3
"""Draws bench_budget's JSON lines: step time (relative to the stored model) against the measured
activation peak, the budget policy's choices as a line over the budgets, the hand-chosen policies
as labelled points.

    plot_budget.py bench/results/budget-host.jsonl bench/results/budget-host.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, out):
    rows = [json.loads(line) for line in open(src) if line.strip()]
    rows = [r for r in rows if r.get("kind") == "budget"]
    sweep = [r for r in rows if r["row"] == "budget"]
    hand = [r for r in rows if r["row"] != "budget"]
    mib = 1 << 20
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.step([r["budget_bytes"] / mib for r in sweep], [r["step_s"] / r["stored_step_s"] for r in sweep],
            where="post", color="tab:blue", label="Budget<Bytes>: step time at each budget")
    ax.plot([r["peak_activation_bytes"] / mib for r in sweep], [r["step_s"] / r["stored_step_s"] for r in sweep],
            "o", color="tab:blue", label="its measured peak")
    for r in hand:
        x, y = r["peak_activation_bytes"] / mib, r["step_s"] / r["stored_step_s"]
        ax.plot([x], [y], "s", color="tab:orange")
        ax.annotate(r["row"], (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    first = rows[0]
    ax.set_xlabel("activation peak / budget (MiB)")
    ax.set_ylabel("step time / stored model's")
    ax.set_title(f"Budget sweep: residual MLP, {first['blocks']} blocks of {first['width']}, batch {first['batch']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print("wrote", out)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
