#!/usr/bin/env python3
"""PyTorch's side of `bench_policies_cuda --offload-optimizer`: an optimizer offloaded to the host
the way a PyTorch user without DeepSpeed writes it, at its best, on the same 16-block model
(d = 4096, 537 M parameters) on the GPU:

  - the model's parameters and gradients are views into one flat GPU buffer each, so the
    gradients cross in one copy (non_blocking, into page-locked memory) and the weights come back
    in one;
  - the gradients are clipped on the GPU (clip_grad_norm_, foreach) before they cross; the host
    keeps one flat fp32 master tensor and runs torch.optim.AdamW(fused=True) on it (one
    vectorised pass over all threads); offloaded_step_host_clip clips on the host instead;
  - a step is timed up to the weights being on the GPU again.

Beside it: the fused AdamW on the GPU (clipping on the GPU), and whole training steps (forward,
backward, step) with each. Prints JSON lines like remat's:
  python3 bench/offload_torch.py [--precision fp32|bf16] [--batch 8192] [--steps 5]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn

D, BLOCKS = 4096, 16


class Residual(nn.Module):
    """x + inner(x): the benchmark's block is Residual(LayerNorm, Linear, GELU, Linear)."""

    def __init__(self, *layers):
        super().__init__()
        self.inner = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.inner(x)


def block():
    return Residual(nn.LayerNorm(D), nn.Linear(D, D), nn.GELU(), nn.Linear(D, D))


def flatten(net):
    """Makes every parameter and its gradient a view into one flat GPU buffer each."""
    params = list(net.parameters())
    n = sum(p.numel() for p in params)
    flat = torch.empty(n, device="cuda")
    grad = torch.zeros(n, device="cuda")
    at = 0
    with torch.no_grad():
        for p in params:
            k = p.numel()
            flat[at:at + k].copy_(p.reshape(-1))
            p.data = flat[at:at + k].view_as(p)
            p.grad = grad[at:at + k].view_as(p)
            at += k
    return flat, grad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--batch", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(1)
    net = nn.Sequential(*[block() for _ in range(BLOCKS)]).cuda()
    flat, grad = flatten(net)
    n = flat.numel()
    grad.fill_(1e-3)
    x = torch.rand(args.batch, D, device="cuda") * 2 - 1
    t = torch.rand(args.batch, D, device="cuda") * 2 - 1
    bf16 = args.precision == "bf16"

    def line(what, s):
        print("json: " + json.dumps({
            "library": "pytorch", "kind": "offload_optimizer", "precision": args.precision, "parameters": n,
            "what": what, "batch": args.batch, "s": s, "threads": torch.get_num_threads(),
            "device": torch.cuda.get_device_name(), "torch_version": torch.__version__}), flush=True)

    def timed(f):
        times = []
        for r in range(args.steps + 2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            f()
            torch.cuda.synchronize()
            if r >= 2:
                times.append(time.perf_counter() - t0)
        return statistics.median(times)

    gpu_opt = torch.optim.AdamW(net.parameters(), lr=1e-4, fused=True)

    def gpu_step():
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0, foreach=True)
        gpu_opt.step()

    line("adamw_gpu_step", timed(gpu_step))

    master = torch.empty(n, pin_memory=True)
    master.copy_(flat)
    master = nn.Parameter(master)
    master.grad = torch.empty(n, pin_memory=True)
    cpu_opt = torch.optim.AdamW([master], lr=1e-4, fused=True)

    def offloaded_step():  # clipped on the GPU (one fused norm), then down, update, up
        torch.nn.utils.clip_grad_norm_([grad], 1.0, foreach=True)
        master.grad.copy_(grad, non_blocking=True)
        torch.cuda.synchronize()
        cpu_opt.step()
        flat.copy_(master.detach(), non_blocking=True)

    def offloaded_step_host_clip():  # the same, clipped on the host
        master.grad.copy_(grad, non_blocking=True)
        torch.cuda.synchronize()
        torch.nn.utils.clip_grad_norm_([master], 1.0)
        cpu_opt.step()
        flat.copy_(master.detach(), non_blocking=True)

    line("offloaded_step", timed(offloaded_step))
    line("offloaded_step_host_clip", timed(offloaded_step_host_clip))
    down = timed(lambda: master.grad.copy_(grad, non_blocking=True))
    up = timed(lambda: flat.copy_(master.detach(), non_blocking=True))
    line("copy_down", down)
    line("copy_up", up)
    line("host_update", timed(cpu_opt.step))

    def train(step):
        def one():
            grad.zero_()
            if bf16:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = nn.functional.mse_loss(net(x).float(), t)
            else:
                loss = nn.functional.mse_loss(net(x), t)
            loss.backward()
            step()
        return one

    line("adamw_gpu_train_step", timed(train(gpu_step)))
    line("offloaded_train_step", timed(train(offloaded_step)))


if __name__ == "__main__":
    main()
