#!/usr/bin/python3
"""The PyTorch peer of bench_dist: the same residual MLP (d = 1024, 8 blocks, LayerNorm at the
end, MSE, AdamW) at the same global batch, alone or under DistributedDataParallel over gloo with
the batch split across P processes (2 / P threads each, as remat's ranks get).

  /usr/bin/python3 bench/ddp_torch.py --ranks 2 [--batch 256] [--steps 7] [--warmup 2]

Prints one JSON line (rank 0): ranks, threads, median step time (the slowest rank's), the BLAS it
loaded. bench/dist_scaling.sh runs it beside remat with the environment settings it reports.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from peer_common import fastest_adamw

D, N = 1024, 8


def loaded_blas():
    with open("/proc/self/maps") as f:
        libs = {line.split()[-1] for line in f if "blas" in line.lower() and line.split()[-1].startswith("/")}
    return sorted(libs)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(D)
        self.fc1 = torch.nn.Linear(D, D)
        self.fc2 = torch.nn.Linear(D, D)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


def worker(rank, ranks, args, port, out):
    torch.set_num_threads(max(1, 2 // ranks))
    if ranks > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=ranks)
    torch.manual_seed(1)
    net = torch.nn.Sequential(*[Block() for _ in range(N)], torch.nn.LayerNorm(D))
    model = torch.nn.parallel.DistributedDataParallel(net) if ranks > 1 else net
    opt = fastest_adamw(torch, model.parameters(), 1e-4)
    lo, hi = args.batch * rank // ranks, args.batch * (rank + 1) // ranks
    i = torch.arange(lo * D, hi * D, dtype=torch.float64)
    x = torch.sin(0.001 * i).float().reshape(hi - lo, D)
    y = torch.cos(0.002 * i).float().reshape(hi - lo, D)
    times = []
    for s in range(args.warmup + args.steps):
        if ranks > 1:
            dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        t = time.perf_counter() - t0
        if s >= args.warmup:
            times.append(t)
    step = statistics.median(times)
    if ranks > 1:
        t = torch.tensor([step], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        step = float(t[0])
        dist.destroy_process_group()
    # Per rank: the bytes of the parameters, their gradients and AdamW's state tensors (DDP's
    # reducer also keeps gradient buckets, not counted here).
    param_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in net.parameters() if p.grad is not None)
    state_bytes = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values()
                      if torch.is_tensor(v) and v.dim() > 0)
    if rank == 0:
        out.put({"bench": "dist", "library": "torch", "param_bytes": param_bytes, "grad_held_bytes": grad_bytes,
                 "optimizer_state_bytes": state_bytes, "mode": "ddp" if ranks > 1 else "alone", "ranks": ranks,
                 "threads": torch.get_num_threads(), "batch": args.batch, "blocks": N, "width": D, "step_s": step,
                 "samples_per_s": args.batch / step, "torch": torch.__version__, "blas": loaded_blas(),
                 "malloc_tuned": "MALLOC_MMAP_THRESHOLD_" in os.environ, "loss": float(loss)})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    args = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    if args.ranks == 1:
        worker(0, 1, args, port, out)
    else:
        procs = [ctx.Process(target=worker, args=(r, args.ranks, args, port, out)) for r in range(args.ranks)]
        for q in procs:
            q.start()
        for q in procs:
            q.join()
        if any(q.exitcode != 0 for q in procs):
            sys.exit("ddp_torch: a rank failed")
    print(json.dumps(out.get(timeout=60)))


if __name__ == "__main__":
    main()
