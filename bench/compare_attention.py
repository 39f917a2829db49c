#!/usr/bin/python3
"""Causal attention at long sequences: remat's cores against today's PyTorch's, interleaved.

One attention core (the same function in all): the projections x, (batch * seq) x 3W with W = 256
in 4 heads of 64, split into q, k, v; y = softmax(q k^T / sqrt(64), causal) v, heads side by side;
MSE against a fixed target; the time of forward + backward (with the input's gradient), fp32,
2 threads; batch = 4096 / seq sequences (the same 4096 tokens at every length).

remat's cores: stored (AttentionCore: the probabilities kept), recompute
(Checkpointed<AttentionCore>, RecomputeAttention's core) and blocked (BlockedAttentionCore: query
panels, memory linear in seq). The anchor is today's PyTorch at its best: the PyPI version that
`scripts/setup.sh bench` pins in .venv-bench (--torch-python picks another interpreter), with
F.scaled_dot_product_attention(is_causal=True) (its fused flash kernel on the CPU), run four ways:
eager and torch.compile, each with glibc's default malloc and with MALLOC_MMAP_THRESHOLD_ /
MALLOC_TRIM_THRESHOLD_ raised. The first round runs all four and keeps the fastest; later rounds
run that one. Debian's PyTorch 1.13 (/usr/bin/python3, as Debian ships it) runs once per length as
one more row: nanoGPT's attention written out (att = q @ k^T * scale; masked_fill; softmax;
att @ v), as 1.13 has no scaled_dot_product_attention.

For each length it alternates: remat's three cores, then PyTorch; --rounds times, each figure the
median over the rounds. Memory: remat's activation peak over the step (equal to its plan) and
what its forward kept; PyTorch's is what its forward kept only: the growth of glibc's heap over
the forward (mallinfo2), its output excluded.

  /usr/bin/python3 bench/compare_attention.py --remat build/default/bench/bench_attention [--quick] [--rounds 3]

Writes bench/results/attention-host.jsonl, .md and (with matplotlib) .png.
"""
import argparse
import json
import os

from peer_common import (DEBIAN_PYTHON, add_peer_options, chosen_peers, cpu_name, heap_in_use, loaded_blas, median_row,
                         run_child, run_peer, timed_steps, today, write_results)

CORES = ["stored", "recompute", "blocked"]
W, H, TOKENS = 256, 4, 4096


def torch_child(args):
    import math
    import torch

    torch.set_num_threads(2)
    torch.manual_seed(0)

    seq, batch = args.seq, args.batch
    mask = torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq)  # nanoGPT's registered buffer

    sdpa = hasattr(torch.nn.functional, "scaled_dot_product_attention")  # PyTorch 2.0 on

    def attention(x):  # nanoGPT's CausalSelfAttention.forward between c_attn and c_proj
        q, k, v = x.view(batch, seq, 3 * W).split(W, dim=2)
        q = q.view(batch, seq, H, W // H).transpose(1, 2)
        k = k.view(batch, seq, H, W // H).transpose(1, 2)
        v = v.view(batch, seq, H, W // H).transpose(1, 2)
        if sdpa:
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(mask[:, :, :seq, :seq] == 0, float("-inf"))
            att = torch.nn.functional.softmax(att, dim=-1)
            y = att @ v
        return y.transpose(1, 2).contiguous().view(batch * seq, W)

    x = (torch.rand(batch * seq, 3 * W) * 2 - 1).requires_grad_()
    t = torch.rand(batch * seq, W)
    # torch.compile: the loss (attention and MSE) as one graph, its backward with it; compiled in
    # the untimed steps.
    loss_of = (lambda: torch.nn.functional.mse_loss(attention(x), t))
    if args.compile:
        loss_of = torch.compile(loss_of)

    def step():
        x.grad = None
        loss = loss_of()
        loss.backward()
        return loss.item()

    step_s, loss = timed_steps(step, args.warmup, args.steps)
    x.grad = None
    h0 = heap_in_use()
    y = attention(x)
    saved = heap_in_use() - h0 - y.numel() * 4
    del y
    blas = ", ".join(loaded_blas()) or "none mapped"
    print(json.dumps({"library": "pytorch", "core": "sdpa" if sdpa else "nanogpt", "seq": seq, "batch": batch,
                      "width": W, "heads": H,
                      "threads": torch.get_num_threads(), "steps": args.steps, "step_s": step_s,
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
    ap.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    add_peer_options(ap)
    args = ap.parse_args()
    if args.torch_child:
        torch_child(args)
        return
    seqs = [int(s) for s in args.seqs.split(",")]
    if args.quick:
        seqs, args.rounds, args.steps = [256], 1, 1
    python, debian = chosen_peers(args)
    lines, chosen = [], {}
    for seq in seqs:
        batch = max(1, TOKENS // seq)
        common = ["--seq", str(seq), "--batch", str(batch), "--steps", str(args.steps), "--warmup", str(args.warmup)]
        results = {**{c: [] for c in CORES}, "pytorch": []}
        for rnd in range(args.rounds):
            for c in CORES:
                results[c].append(run_child([args.remat, "--core", c] + common, {}))
            results["pytorch"].append(run_peer(python, [__file__, "--torch-child"] + common, chosen, seq))
            if debian and rnd == 0:
                results["debian"] = [run_child([DEBIAN_PYTHON, __file__, "--torch-child"] + common, {})]
        row = median_row(results)
        anchor = row["pytorch"]
        for c in CORES:
            row[c]["time_vs_pytorch"] = row[c]["step_s"] / anchor["step_s"]
            row[c]["time_vs_stored"] = row[c]["step_s"] / row["stored"]["step_s"]
            row[c]["peak_vs_stored"] = row[c]["peak_activation_bytes"] / row["stored"]["peak_activation_bytes"]
            if "debian" in row:
                row[c]["time_vs_debian_pytorch"] = row[c]["step_s"] / row["debian"]["step_s"]
        for r in row.values():
            lines.append(r)
            print(json.dumps(r), flush=True)
    stamp, cpu = today(), cpu_name()
    torch_line = next(l for l in lines if l["setting"] == "pytorch")
    old = next((l for l in lines if l["setting"] == "debian"), None)
    md = [f"<!-- {stamp}, {cpu}, {os.cpu_count()} cores; bench/compare_attention.py -->",
          f"One causal attention core, width {W} in {H} heads of {W // H}, {TOKENS} tokens (batch = {TOKENS} / seq), "
          f"fp32, forward + backward with the input's gradient, 2 threads; median of {args.rounds} interleaved "
          f"rounds of {args.steps}. {cpu}, {stamp}.", "",
          f"| seq | core | step (s) | vs PyTorch {torch_line['torch']} | vs stored | activation peak (MiB) | "
          f"peak vs stored | kept by forward (MiB) |" + (" vs Debian's 1.13 |" if old else ""),
          "|---:|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if old else "")]
    for seq in seqs:
        anchor = next(l for l in lines if l["setting"] == "pytorch" and l["seq"] == seq)
        ways = ", ".join(f"{w} {t:.3f} s" for w, t in anchor["ways"].items())
        md.append(f"| {seq} | PyTorch {anchor['torch']} {anchor['core']} ({anchor['way']}; first round: {ways}) | "
                  f"{anchor['step_s']:.3f} | 1.00x | | | | {anchor['saved_activation_bytes'] / 2**20:.1f} |" +
                  (" |" if old else ""))
        deb = next((l for l in lines if l["setting"] == "debian" and l["seq"] == seq), None)
        if deb:
            md.append(f"| {seq} | PyTorch {deb['torch']} {deb['core']}, as Debian ships it (one round) | "
                      f"{deb['step_s']:.3f} | {deb['step_s'] / anchor['step_s']:.2f}x | | | | "
                      f"{deb['saved_activation_bytes'] / 2**20:.1f} | |")
        for r in lines:
            if r["library"] == "remat" and r["seq"] == seq:
                md.append(f"| {seq} | {r['core']} | {r['step_s']:.3f} | {r['time_vs_pytorch']:.2f}x | "
                          f"{r['time_vs_stored']:.2f}x | {r['peak_activation_bytes'] / 2**20:.1f} | "
                          f"{r['peak_vs_stored']:.3f}x | {r['saved_activation_bytes'] / 2**20:.2f} |" +
                          (f" {r['time_vs_debian_pytorch']:.2f}x |" if old else ""))
    md.append("")
    md.append(f"PyTorch {torch_line.get('torch')} (the anchor), BLAS {torch_line.get('blas')}." +
              (f" Debian's: PyTorch {old.get('torch')}, BLAS {old.get('blas')}." if old else ""))
    write_results(args.out, lines, md)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    peer = f"PyTorch {torch_line['torch']} {torch_line['core']}"
    for name, pick in [(peer, lambda l: l["setting"] == "pytorch")] + \
            [(c, (lambda c: lambda l: l["library"] == "remat" and l["core"] == c)(c)) for c in CORES]:
        pts = [l for l in lines if pick(l)]
        a.plot([p["seq"] for p in pts], [p["step_s"] for p in pts], marker="o", label=name)
        if name != peer:
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
