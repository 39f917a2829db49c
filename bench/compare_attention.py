#!/usr/bin/python3
"""Causal attention at long sequences: remat's cores against PyTorch's nanoGPT attention, interleaved.

One attention core (the same function in all): the projections x, (batch * seq) x 3W with W = 256
in 4 heads of 64, split into q, k, v; y = softmax(q k^T / sqrt(64), causal) v, heads side by side;
MSE against a fixed target; the time of forward + backward (with the input's gradient), fp32,
2 threads; batch = 4096 / seq sequences (the same 4096 tokens at every length).

remat's cores: stored (AttentionCore: the probabilities kept), recompute
(Checkpointed<AttentionCore>, RecomputeAttention's core) and blocked (BlockedAttentionCore: query
panels, memory linear in seq). PyTorch 1.13: nanoGPT's attention without the fused kernel
(att = q @ k^T * scale; masked_fill; softmax; att @ v), which 1.13's CPU build would not fuse.

For each length it alternates: remat's three cores, PyTorch as shipped, PyTorch with glibc's
MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ raised; --rounds times. The faster PyTorch
setting is the anchor of the ratios. Memory: remat's activation peak over the step (equal to its
plan) and what its forward kept; PyTorch's is what its forward kept only: the growth of glibc's
heap over the forward (mallinfo2), its output excluded.

  /usr/bin/python3 bench/compare_attention.py --remat build/default/bench/bench_attention [--quick] [--rounds 3]

Writes bench/results/attention-host.jsonl, .md and (with matplotlib) .png.
"""
import argparse
import json
import os
import statistics
import sys
import time

from peer_common import MALLOC_TUNED, cpu_name, heap_in_use, loaded_blas, median_row, run_child, today, write_results

SETTINGS = [("as shipped", {}), ("malloc tuned", MALLOC_TUNED)]
CORES = ["stored", "recompute", "blocked"]
W, H, TOKENS = 256, 4, 4096


def torch_child(args):
    import math
    import torch

    torch.set_num_threads(2)
    torch.manual_seed(0)

    seq, batch = args.seq, args.batch
    mask = torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq)  # nanoGPT's registered buffer

    def attention(x):  # nanoGPT's CausalSelfAttention.forward between c_attn and c_proj
        q, k, v = x.view(batch, seq, 3 * W).split(W, dim=2)
        q = q.view(batch, seq, H, W // H).transpose(1, 2)
        k = k.view(batch, seq, H, W // H).transpose(1, 2)
        v = v.view(batch, seq, H, W // H).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(mask[:, :, :seq, :seq] == 0, float("-inf"))
        att = torch.nn.functional.softmax(att, dim=-1)
        y = att @ v
        return y.transpose(1, 2).contiguous().view(batch * seq, W)

    x = (torch.rand(batch * seq, 3 * W) * 2 - 1).requires_grad_()
    t = torch.rand(batch * seq, W)

    def step():
        x.grad = None
        loss = torch.nn.functional.mse_loss(attention(x), t)
        loss.backward()
        return loss.item()

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    x.grad = None
    h0 = heap_in_use()
    y = attention(x)
    saved = heap_in_use() - h0 - y.numel() * 4
    del y
    blas = ", ".join(loaded_blas()) or "none mapped"
    print(json.dumps({"library": "pytorch", "core": "nanogpt", "seq": seq, "batch": batch, "width": W, "heads": H,
                      "threads": torch.get_num_threads(), "steps": args.steps, "step_s": statistics.median(times),
                      "saved_activation_bytes": saved, "loss": loss, "blas": blas, "torch": torch.__version__}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--remat", default="build/default/bench/bench_attention")
    ap.add_argument("--out", default="bench/results/attention-host")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seqs", default="512,1024,2048,4096")
    ap.add_argument("--torch-child", action="store_true")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    if args.torch_child:
        torch_child(args)
        return
    seqs = [int(s) for s in args.seqs.split(",")]
    if args.quick:
        seqs, args.rounds, args.steps = [256], 1, 1
    lines = []
    for seq in seqs:
        batch = max(1, TOKENS // seq)
        common = ["--seq", str(seq), "--batch", str(batch), "--steps", str(args.steps), "--warmup", str(args.warmup)]
        results = {**{c: [] for c in CORES}, **{name: [] for name, _ in SETTINGS}}
        for _ in range(args.rounds):
            for c in CORES:
                results[c].append(run_child([args.remat, "--core", c] + common, {}))
            for name, env in SETTINGS:
                results[name].append(run_child([sys.executable, __file__, "--torch-child"] + common, env))
        row = median_row(results)
        anchor = min((row[name] for name, _ in SETTINGS), key=lambda r: r["step_s"])
        for c in CORES:
            row[c]["time_vs_pytorch"] = row[c]["step_s"] / anchor["step_s"]
            row[c]["time_vs_stored"] = row[c]["step_s"] / row["stored"]["step_s"]
            row[c]["peak_vs_stored"] = row[c]["peak_activation_bytes"] / row["stored"]["peak_activation_bytes"]
            row[c]["anchor"] = anchor["setting"]
        for r in row.values():
            lines.append(r)
            print(json.dumps(r), flush=True)
    stamp, cpu = today(), cpu_name()
    torch_line = next(l for l in lines if l["library"] == "pytorch")
    md = [f"<!-- {stamp}, {cpu}, {os.cpu_count()} cores; bench/compare_attention.py -->",
          f"One causal attention core, width {W} in {H} heads of {W // H}, {TOKENS} tokens (batch = {TOKENS} / seq), "
          f"fp32, forward + backward with the input's gradient, 2 threads; median of {args.rounds} interleaved "
          f"rounds of {args.steps}. {cpu}, {stamp}.", "",
          "| seq | core | step (s) | vs PyTorch | vs stored | activation peak (MiB) | peak vs stored | kept by forward (MiB) |",
          "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for seq in seqs:
        peers = [l for l in lines if l["library"] == "pytorch" and l["seq"] == seq]
        anchor = min(peers, key=lambda p: p["step_s"])
        md.append(f"| {seq} | PyTorch nanoGPT ({' / '.join('%.3f' % p['step_s'] for p in peers)} s as shipped / "
                  f"malloc tuned) | {anchor['step_s']:.3f} | 1.00x | | | | "
                  f"{anchor['saved_activation_bytes'] / 2**20:.1f} |")
        for r in lines:
            if r["library"] == "remat" and r["seq"] == seq:
                md.append(f"| {seq} | {r['core']} | {r['step_s']:.3f} | {r['time_vs_pytorch']:.2f}x | "
                          f"{r['time_vs_stored']:.2f}x | {r['peak_activation_bytes'] / 2**20:.1f} | "
                          f"{r['peak_vs_stored']:.3f}x | {r['saved_activation_bytes'] / 2**20:.2f} |")
    md.append("")
    md.append(f"PyTorch {torch_line.get('torch')}, BLAS {torch_line.get('blas')}.")
    write_results(args.out, lines, md)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for name, pick in [("PyTorch nanoGPT", lambda l: l["library"] == "pytorch" and l["setting"] == anchor["setting"])] + \
            [(c, (lambda c: lambda l: l["library"] == "remat" and l["core"] == c)(c)) for c in CORES]:
        pts = [l for l in lines if pick(l)]
        a.plot([p["seq"] for p in pts], [p["step_s"] for p in pts], marker="o", label=name)
        if name != "PyTorch nanoGPT":
            b.plot([p["seq"] for p in pts], [p["peak_activation_bytes"] / 2**20 for p in pts], marker="o", label=name)
        else:
            b.plot([p["seq"] for p in pts], [p["saved_activation_bytes"] / 2**20 for p in pts], marker="o",
                   linestyle="--", label=name + " (kept by forward)")
    for ax, title, unit in [(a, "forward + backward", "seconds"), (b, "activation memory", "MiB")]:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length (4096 tokens)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.suptitle(f"causal attention, W {W}, {H} heads, fp32, 2 threads ({cpu}, {stamp})", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=110)


if __name__ == "__main__":
    main()
