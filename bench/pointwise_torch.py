"""PyTorch's point-wise passes, the peer of two of bench_expr's tables. First its point-wise ops where
memory does not bound them ("point-wise functions in cache"): the same 128 x 1024 values
(x[i] = (i * 37 mod 1000) / 250 - 2, b[c] = 0.01 (c mod 7), dy = 0.5), each op into a preallocated
output, ns per element, median of the rounds of 50 calls, eager and, for the GELU rows,
torch.compile (which fuses the bias into GELU's pass as remat's layers do). Then its fused AdamW
(torch._fused_adamw_, one fp32 tensor each of parameters, gradients and moments) over as many
parameters as `bench_expr N` gives its optimizer table ("AdamW (fp32)": the same 28 bytes a
parameter), median of the rounds. 2 threads. Run with today's PyTorch:

    .venv-bench/bin/python bench/pointwise_torch.py [--rounds 15] [--parameters 16777216]
"""
import argparse
import json
import time

import torch


def per_element(f, n, rounds):
    f()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(50):
            f()
        times.append((time.perf_counter() - t0) / 50 / n * 1e9)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--parameters", type=int, default=1 << 24)
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds: expected at least 1")
    if args.parameters < 1:
        ap.error("--parameters: expected at least 1")
    torch.set_num_threads(2)
    rows, cols = 128, 1024
    n = rows * cols
    i = torch.arange(n, dtype=torch.float64)
    print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads; ns per element, 128 x 1024 values\n")
    print("| function | fp32 | bf16 | fp32, compiled | bf16, compiled |\n|---|---|---|---|---|")
    results = {}
    for dt, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        x = (torch.remainder(i * 37, 1000) / 250 - 2).reshape(rows, cols).to(dt)
        b = (0.01 * torch.remainder(torch.arange(cols, dtype=torch.float64), 7)).to(dt)
        dy = torch.full((rows, cols), 0.5, dtype=dt)
        y = torch.empty_like(x)
        gelu_bias = torch.compile(lambda x, b: torch.nn.functional.gelu(x + b))
        gelu_grad_bias = torch.compile(lambda dy, x, b: torch.ops.aten.gelu_backward(dy, x + b))
        eager = {
            "copy": lambda: y.copy_(x),
            "exp": lambda: torch.exp(x, out=y),
            "tanh": lambda: torch.tanh(x, out=y),
            "sigmoid": lambda: torch.sigmoid(x, out=y),
            "gelu": lambda: torch._C._nn.gelu(x, out=y),
            "gelu(x + b)": lambda: torch._C._nn.gelu(torch.add(x, b, out=y), out=y),
            "dy * gelu'(x + b)": lambda: torch.ops.aten.gelu_backward(dy, torch.add(x, b, out=y)),
        }
        compiled = {"gelu(x + b)": lambda: gelu_bias(x, b), "dy * gelu'(x + b)": lambda: gelu_grad_bias(dy, x, b)}
        for fn, f in eager.items():
            results.setdefault(fn, {})[name] = per_element(f, n, args.rounds)
            if fn in compiled:
                results[fn][name + " compiled"] = per_element(compiled[fn], n, args.rounds)
    for fn, r in results.items():
        cells = [r.get(k) for k in ("fp32", "bf16", "fp32 compiled", "bf16 compiled")]
        print(f"| {fn} | " + " | ".join("" if c is None else f"{c:.3f}" for c in cells) + " |")
    print()
    for fn, r in results.items():
        for k, v in r.items():
            print("json: " + json.dumps({"bench": "function", "library": "pytorch", "version": torch.__version__,
                                         "function": fn, "type": k, "ns_per_element": round(v, 4)}))
    p = [torch.full((args.parameters,), 0.5)]
    g = [torch.full((args.parameters,), 1e-3)]
    m, v = [torch.zeros(args.parameters)], [torch.zeros(args.parameters)]
    step = [torch.tensor(1.0)]

    def adamw():
        torch._fused_adamw_(p, g, m, v, [], step, lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=1e-2, eps=1e-8,
                            amsgrad=False, maximize=False)

    adamw()
    times = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        adamw()
        times.append(time.perf_counter() - t0)
    times.sort()
    s = times[len(times) // 2]
    print(f"\nfused AdamW over {args.parameters} fp32 parameters: {s * 1e3:.2f} ms, {28 * args.parameters / s / 1e9:.1f} GB/s "
          "at 28 bytes a parameter")
    print("json: " + json.dumps({"bench": "optimizer", "library": "pytorch", "version": torch.__version__,
                                 "pass": "fused AdamW (fp32)", "parameters": args.parameters, "s": round(s, 6)}))


if __name__ == "__main__":
    main()
