#!/usr/bin/python3
"""remat against PyTorch on a ResNet stack, interleaved in one run.

The model (the same in both, fp32, NCHW): a stem Conv3x3(3 -> 64) + BatchNorm2d + ReLU, N basic
blocks  x -> ReLU(x + BN(Conv3x3(ReLU(BN(Conv3x3(x))))))  at 64 channels, a head of global
average pooling and Linear(64, 10); MSE against a fixed target; AdamW; 2 threads; images of
64 x 64 (--size 32 for a smaller run), batch 32.

Policies: stored (PyTorch: plain autograd) and checkpoint (every block checkpointed; PyTorch:
torch.utils.checkpoint per block, use_reentrant=False). PyTorch's CPU convolutions are oneDNN's
(MKL-DNN 2.6 in Debian's 1.13), as remat's are.

For each configuration it alternates: remat, PyTorch as shipped, PyTorch with glibc's
MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ raised; --rounds times. The faster PyTorch setting
is the anchor of the ratios. Saved activations: remat's allocator when the forward ends (equal to
its plan); PyTorch's is the growth of glibc's heap over the forward (mallinfo2), minus the output,
in an untimed step.

  /usr/bin/python3 bench/compare_conv.py --remat build/default/bench/bench_conv [--quick] [--rounds 3] [--configs 8,16]

Each row's lines (remat's with the ratios, then each PyTorch setting's) are printed as they finish.

Writes bench/results/conv-host.jsonl and .md.
"""
import argparse
import json
import os
import statistics
import sys
import time

from peer_common import MALLOC_TUNED, cpu_name, heap_in_use, loaded_blas, median_row, run_child, today, write_results

SETTINGS = [("as shipped", {}), ("malloc tuned", MALLOC_TUNED)]
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
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    x = torch.rand(args.batch, 3, s, s) * 2 - 1
    t = torch.rand(args.batch, 10)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(net(x), t)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    # Saved activations: the heap's growth over a forward, its output excluded.
    opt.zero_grad(set_to_none=True)
    h0 = heap_in_use()
    y = net(x)
    saved = heap_in_use() - h0 - y.numel() * 4
    del y
    blas = ", ".join(loaded_blas()) or "none mapped"
    print(json.dumps({"library": "pytorch", "policy": args.policy, "blocks": args.blocks, "batch": args.batch,
                      "size": s, "channels": C, "threads": torch.get_num_threads(), "steps": args.steps,
                      "step_s": statistics.median(times), "saved_activation_bytes": saved, "loss": loss,
                      "blas": blas, "torch": torch.__version__, "mkldnn": torch.backends.mkldnn.is_available()}))


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
    args = ap.parse_args()
    if args.torch_child:
        torch_child(args)
        return
    if args.quick:
        configs, args.rounds, args.steps, args.size, args.batch = [2], 1, 1, 32, 4
    else:
        configs = [int(c) for c in args.configs.split(",")]
    lines = []
    for n in configs:
        for policy in ("stored", "checkpoint"):
            results = {"remat": [], **{name: [] for name, _ in SETTINGS}}
            for _ in range(args.rounds):
                common = ["--blocks", str(n), "--policy", policy, "--batch", str(args.batch), "--size",
                          str(args.size), "--steps", str(args.steps)]
                results["remat"].append(run_child([args.remat] + common, {}))
                for name, env in SETTINGS:
                    results[name].append(run_child([sys.executable, __file__, "--torch-child"] + common, env))
            row = median_row(results)
            lines.extend(row.values())
            anchor = min((row[name] for name, _ in SETTINGS), key=lambda r: r["step_s"])
            row["remat"]["time_ratio"] = row["remat"]["step_s"] / anchor["step_s"]
            row["remat"]["saved_ratio"] = row["remat"]["saved_activation_bytes"] / max(1, anchor["saved_activation_bytes"])
            row["remat"]["anchor"] = anchor["setting"]
            for r in row.values():
                print(json.dumps(r), flush=True)
    stamp, cpu = today(), cpu_name()
    md = [f"<!-- {stamp}, {cpu}, {os.cpu_count()} cores; bench/compare_conv.py -->",
          f"ResNet stack, 64 channels, {args.size}x{args.size}, batch {args.batch}, fp32, AdamW, 2 threads; "
          f"median of {args.rounds} interleaved rounds of {args.steps} steps. {cpu}, {stamp}.", "",
          "| blocks | policy | remat step (s) | PyTorch step (s), as shipped / malloc tuned | time vs PyTorch | "
          "remat saved (MiB) | PyTorch saved (MiB) | saved vs PyTorch |",
          "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in lines:
        if r["setting"] != "remat":
            continue
        peers = [l for l in lines if l["library"] == "pytorch" and l["blocks"] == r["blocks"]
                 and l["policy"] == r["policy"]]
        anchor = min(peers, key=lambda p: p["step_s"])
        peer_times = " / ".join("%.2f" % p["step_s"] for p in peers)
        md.append(f"| {r['blocks']} | {r['policy']} | {r['step_s']:.2f} | "
                  f"{peer_times} | {r['time_ratio']:.2f}x | "
                  f"{r['saved_activation_bytes'] / 2**20:.1f} | {anchor['saved_activation_bytes'] / 2**20:.1f} | "
                  f"{r['saved_ratio']:.2f}x |")
    md.append("")
    md.append(f"PyTorch {lines[1].get('torch')} (oneDNN: {lines[1].get('mkldnn')}), BLAS {lines[1].get('blas')}.")
    write_results(args.out, lines, md)


if __name__ == "__main__":
    main()
