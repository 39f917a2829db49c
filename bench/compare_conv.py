#!/usr/bin/python3
"""remat against PyTorch on a ResNet stack, interleaved in one run.

The model (the same in both, fp32, NCHW): a stem Conv3x3(3 -> 64) + BatchNorm2d + ReLU, N basic
blocks  x -> ReLU(x + BN(Conv3x3(ReLU(BN(Conv3x3(x))))))  at 64 channels, a head of global
average pooling and Linear(64, 10); MSE against a fixed target; AdamW; 2 threads; images of
64 x 64 (--size 32 for a smaller run), batch 32. PyTorch's AdamW is its fused one where it has it
on the CPU (2.4 and later).

Policies: stored (PyTorch: plain autograd) and checkpoint (every block checkpointed; PyTorch:
torch.utils.checkpoint per block, use_reentrant=False). PyTorch's CPU convolutions are oneDNN's,
as remat's are (oneDNN 3.x in today's PyTorch, MKL-DNN 2.6 in Debian's 1.13 and in remat here).

The anchor is today's PyTorch at its best: the PyPI version that `scripts/setup.sh bench` pins in
.venv-bench (--torch-python picks another interpreter), run four ways: eager and torch.compile (the
loss, checkpoints included, as one graph), each with glibc's default malloc and with
MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ raised. The first round runs all four and keeps the
fastest; later rounds run that one. Debian's PyTorch 1.13 (/usr/bin/python3, as Debian ships it,
eager) runs once per configuration as one more row. For each configuration it alternates remat and
PyTorch, --rounds times; each figure is the median over the rounds. Saved activations: remat's
allocator when the forward ends (equal to its plan); PyTorch's is the growth of glibc's heap
(mallinfo2) over the forward, minus the output, in an untimed step.

  /usr/bin/python3 bench/compare_conv.py --remat build/default/bench/bench_conv [--quick] [--rounds 3] [--configs 8,16]

Each row's lines (remat's with the ratios, then PyTorch's) are printed as they finish.

Writes bench/results/conv-host.jsonl and .md.
"""
import argparse
import json
import os

from peer_common import (DEBIAN_PYTHON, add_peer_options, chosen_peers, cpu_name, fastest_adamw, heap_in_use,
                         loaded_blas, median_row, run_child, run_peer, timed_steps, today, write_results)

C = 64


def torch_child(args):
    import torch
    import torch.nn as nn
    import torch.utils.checkpoint as cp

    torch.set_num_threads(2)
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(C, C, 3, padding=1, bias=False)
            self.b1 = nn.BatchNorm2d(C)
            self.c2 = nn.Conv2d(C, C, 3, padding=1, bias=False)
            self.b2 = nn.BatchNorm2d(C)

        def forward(self, x):
            return torch.relu(x + self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))

    class Net(nn.Module):
        def __init__(self, n, checkpoint):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, C, 3, padding=1, bias=False), nn.BatchNorm2d(C), nn.ReLU())
            self.blocks = nn.ModuleList(Block() for _ in range(n))
            self.head = nn.Linear(C, 10)
            self.checkpoint = checkpoint

        def forward(self, x):
            x = self.stem(x)
            for b in self.blocks:
                x = cp.checkpoint(b, x, use_reentrant=False) if self.checkpoint else b(x)
            return self.head(x.mean(dim=(2, 3)))

    s = args.size
    net = Net(args.blocks, args.policy == "checkpoint")
    opt = fastest_adamw(torch, net.parameters(), 1e-3)
    x = torch.rand(args.batch, 3, s, s) * 2 - 1
    t = torch.rand(args.batch, 10)

    # torch.compile: the loss (forward, checkpoints included) as one graph, its backward with it;
    # compiled in the untimed steps.
    loss_of = (lambda: torch.nn.functional.mse_loss(net(x), t))
    forward = net
    if args.compile:
        loss_of, forward = torch.compile(loss_of), torch.compile(net)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_of()
        loss.backward()
        opt.step()
        return loss.item()

    step_s, loss = timed_steps(step, args.warmup, args.steps)
    # Saved activations: the heap's growth over a forward, its output excluded.
    opt.zero_grad(set_to_none=True)
    forward(x)  # (compiled in its first call)
    h0 = heap_in_use()
    y = forward(x)
    saved = heap_in_use() - h0 - y.numel() * 4
    del y
    blas = ", ".join(loaded_blas()) or "none mapped"
    print(json.dumps({"library": "pytorch", "policy": args.policy, "blocks": args.blocks, "batch": args.batch,
                      "size": s, "channels": C, "threads": torch.get_num_threads(), "steps": args.steps,
                      "step_s": step_s, "saved_activation_bytes": saved, "loss": loss,
                      "blas": blas, "torch": torch.__version__, "mkldnn": torch.backends.mkldnn.is_available(),
                      "adamw": "fused" if opt.defaults.get("fused") else "for-each loop",
                      "onednn": next((l.split("DNN")[1].split()[0] for l in torch.__config__.show().splitlines()
                                      if "MKL-DNN" in l), None)}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--remat", default="build/default/bench/bench_conv")
    ap.add_argument("--out", default="bench/results/conv-host")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--torch-child", action="store_true")
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--configs", default="8,16", help="the block counts to run, comma-separated")
    ap.add_argument("--policy", default="stored")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    add_peer_options(ap)
    args = ap.parse_args()
    if args.torch_child:
        torch_child(args)
        return
    if args.quick:
        configs, args.rounds, args.steps, args.size, args.batch = [2], 1, 1, 32, 4
    else:
        configs = [int(c) for c in args.configs.split(",")]
    python, debian = chosen_peers(args)
    lines, chosen = [], {}
    for n in configs:
        for policy in ("stored", "checkpoint"):
            results = {"remat": [], "pytorch": []}
            common = ["--blocks", str(n), "--policy", policy, "--batch", str(args.batch), "--size",
                      str(args.size), "--steps", str(args.steps)]
            for rnd in range(args.rounds):
                results["remat"].append(run_child([args.remat] + common, {}))
                results["pytorch"].append(run_peer(python, [__file__, "--torch-child"] + common, chosen, (n, policy)))
                if debian and rnd == 0:
                    results["debian"] = [run_child([DEBIAN_PYTHON, __file__, "--torch-child"] + common, {})]
            row = median_row(results)
            lines.extend(row.values())
            anchor = row["pytorch"]
            row["remat"]["time_ratio"] = row["remat"]["step_s"] / anchor["step_s"]
            row["remat"]["saved_ratio"] = row["remat"]["saved_activation_bytes"] / max(1, anchor["saved_activation_bytes"])
            if "debian" in row:
                row["remat"]["time_ratio_vs_debian"] = row["remat"]["step_s"] / row["debian"]["step_s"]
            for r in row.values():
                print(json.dumps(r), flush=True)
    stamp, cpu = today(), cpu_name()
    md = [f"<!-- {stamp}, {cpu}, {os.cpu_count()} cores; bench/compare_conv.py -->",
          f"ResNet stack, 64 channels, {args.size}x{args.size}, batch {args.batch}, fp32, AdamW, 2 threads; "
          f"median of {args.rounds} interleaved rounds of {args.steps} steps. {cpu}, {stamp}.", "",
          "| blocks | policy | remat step (s) | PyTorch step (s) (how; first round's ways) | time vs PyTorch | "
          "remat saved (MiB) | PyTorch saved (MiB) | saved vs PyTorch | Debian's 1.13 step (s) | time vs 1.13 |",
          "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in lines:
        if r["setting"] != "remat":
            continue
        same = [l for l in lines if l["blocks"] == r["blocks"] and l["policy"] == r["policy"]]
        anchor = next(l for l in same if l["setting"] == "pytorch")
        old = next((l for l in same if l["setting"] == "debian"), None)
        ways = ", ".join(f"{w} {t:.2f}" for w, t in anchor["ways"].items())
        md.append(f"| {r['blocks']} | {r['policy']} | {r['step_s']:.2f} | "
                  f"{anchor['step_s']:.2f} ({anchor['way']}; {ways}) | {r['time_ratio']:.2f}x | "
                  f"{r['saved_activation_bytes'] / 2**20:.1f} | {anchor['saved_activation_bytes'] / 2**20:.1f} | "
                  f"{r['saved_ratio']:.2f}x | " +
                  (f"{old['step_s']:.2f} | {r['time_ratio_vs_debian']:.2f}x |" if old else " | |"))
    md.append("")
    peer = next(l for l in lines if l["setting"] == "pytorch")
    old = next((l for l in lines if l["setting"] == "debian"), None)
    md.append(f"PyTorch {peer.get('torch')} (the anchor; oneDNN {peer.get('onednn')}), BLAS {peer.get('blas')}." +
              (f" Debian's: PyTorch {old.get('torch')}, BLAS {old.get('blas')}." if old else ""))
    write_results(args.out, lines, md)


if __name__ == "__main__":
    main()
