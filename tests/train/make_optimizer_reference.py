#!/usr/bin/python3
"""Writes optimizer_reference.txt: PyTorch's own AdamW and SGD updates on a small problem.

Run once with Debian's python3-torch; the C++ test (test_optimizers.cpp) reads the file and must
reproduce every parameter after every step. Format, one record per line:
  <name> <values...>
where name is one of: p0 (initial parameters), g<t> (gradient given at step t), and
<optimizer>.<t> (parameters after step t).
"""
import torch

torch.set_default_dtype(torch.float32)
n, steps = 17, 6
p0 = torch.tensor([((i * 37) % 23 - 11) / 7.0 for i in range(n)])
grads = [torch.tensor([(((i + 3 * t) * 53) % 29 - 14) / (5.0 + t) for i in range(n)]) for t in range(steps)]

configs = {
    "adamw": lambda p: torch.optim.AdamW([p], lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1),
    "adamw_b": lambda p: torch.optim.AdamW([p], lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.0),
    "sgd": lambda p: torch.optim.SGD([p], lr=0.05),
    "sgd_momentum": lambda p: torch.optim.SGD([p], lr=0.05, momentum=0.9, weight_decay=0.01),
    "sgd_nesterov": lambda p: torch.optim.SGD([p], lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.02),
}

def fmt(t):
    return " ".join(repr(float(v)) for v in t.tolist())

lines = ["p0 " + fmt(p0)] + [f"g{t} " + fmt(g) for t, g in enumerate(grads)]
for name, make in configs.items():
    p = p0.clone().requires_grad_(True)
    opt = make(p)
    for t in range(steps):
        p.grad = grads[t].clone()
        opt.step()
        lines.append(f"{name}.{t} " + fmt(p.detach()))
with open(__file__.replace("make_optimizer_reference.py", "optimizer_reference.txt"), "w") as f:
    f.write(f"# made by make_optimizer_reference.py with torch {torch.__version__}\n")
    f.write("\n".join(lines) + "\n")
