"""Where today's PyTorch spends its step on compare_torch.py's MLP workload: the step's time, then
torch.profiler's self time per operator, in ms per step, so that a phase of remat's
`bench_policies --profile` can be set beside the peer's (products: aten::mm and aten::addmm;
GELU: aten::gelu and aten::gelu_backward; ...). Eager, 2 threads, its fused AdamW, bf16 under
torch.autocast as in compare_torch.py. Run with today's PyTorch:

    .venv-bench/bin/python bench/profile_torch.py --batch 2048 --blocks 16 --precision bf16
"""
import argparse
import json
import time

import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile

from peer_common import fastest_adamw

D = 1024  # compare_torch.py's MLP width


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.fc1, self.act, self.fc2 = nn.LayerNorm(D), nn.Linear(D, D), nn.GELU(), nn.Linear(D, D)

        def forward(self, x):
            return x + self.fc2(self.act(self.fc1(self.norm(x))))

    net = nn.Sequential(*[Block() for _ in range(args.blocks)])
    opt = fastest_adamw(torch, net.parameters(), 1e-4)
    x, t = torch.rand(args.batch, D) * 2 - 1, torch.rand(args.batch, D) * 2 - 1

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = nn.functional.mse_loss(net(x).float(), t)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(2):
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    step_ms = (time.perf_counter() - start) / args.steps * 1e3
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            step()
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    print(f"PyTorch {torch.__version__}, MLP {args.precision} {args.batch} x {args.blocks}: "
          f"{step_ms:.1f} ms a step (unprofiled); self time per operator, ms per step:")
    split = {}
    for e in ops[:16]:
        ms = e.self_cpu_time_total / 1e3 / args.steps
        split[e.key] = round(ms, 2)
        print(f"  {e.key:36s} {ms:9.2f}")
    print(json.dumps({"library": "pytorch", "kind": "profile", "version": torch.__version__, "workload": "mlp",
                      "precision": args.precision, "batch": args.batch, "blocks": args.blocks,
                      "step_ms": round(step_ms, 2), "self_ms": split}))


if __name__ == "__main__":
    main()
