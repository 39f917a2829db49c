#!/usr/bin/env python3
"""Inference latency of a surrogate, fp32: --model mlp, a per-cell closure model (5 -> 256 -> 256 ->
256 -> 5, GELU) at batches 1, 16, 256 and 4096; --model conv, the convolutional surrogate of
examples/surrogate (64 x 64 grid, three residual blocks of 16 channels with BatchNorm) at batches
1, 16 and 256 (and 4096 when asked: --batches 4096 --inner 1; each activation is then 1 GiB). remat's model::forward(x, out) after reserve_inference (bench_inference),
libtorch from C++ under torch::InferenceMode (bench/inference_libtorch.cpp, built here against the
libtorch inside the PyPI wheel of .venv-bench: scripts/setup.sh bench), and torch.compile from
Python as one more row. Rounds are interleaved (remat, libtorch, torch.compile, then again); each
figure is the median over the rounds of each program's own median. Writes OUT.md and OUT.jsonl.

  bench/compare_inference.py [--model mlp|conv] [--remat build/default/bench/bench_inference]
                             [--rounds 3] [--out bench/results/inference-host (conv: inference-conv-host)]
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
VENV_PYTHON = os.path.join(HERE, "..", ".venv-bench", "bin", "python")

TORCH_COMPILE = r"""
import json, math, sys, time, torch
torch.set_num_threads(2)
torch.manual_seed(1)
seconds, rounds, conv = float(sys.argv[1]), int(sys.argv[2]), sys.argv[4] == "conv"
sys.path.insert(0, sys.argv[5])
from surrogates_torch import surrogate
net, x = surrogate(sys.argv[4], rows=max(256, *[int(v) for v in sys.argv[3].split(",")]))
f = torch.compile(net, dynamic=False)
for b in [int(v) for v in sys.argv[3].split(",")]:
    xb = x[:b].contiguous()
    with torch.inference_mode():
        t0 = time.perf_counter()
        for w in range(20):  # (as bench/timing.hpp's warm_up: fewer, 2 at least, past a second)
            f(xb)
            if w >= 1 and time.perf_counter() - t0 > 1.0:
                break
        per = []
        for _ in range(rounds):
            n, t0 = 0, time.perf_counter()
            while True:
                f(xb)
                n += 1
                if n >= 5 and time.perf_counter() - t0 >= seconds:
                    break
            per.append((time.perf_counter() - t0) / n)
    t = sorted(per)[len(per) // 2]
    print("json: " + json.dumps({"library": "torch.compile " + torch.__version__, "batch": b,
                                 "latency_us": t * 1e6, "rows_per_s": b / t}), flush=True)
"""


def torch_dir(python):
    out = subprocess.run([python, "-c", "import torch, os; print(os.path.dirname(torch.__file__))"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def build_libtorch(python, target):
    t = torch_dir(python)
    src = os.path.join(HERE, "inference_libtorch.cpp")
    deps = [src] + [os.path.join(HERE, h) for h in ("heap_count.hpp", "timing.hpp")]
    if os.path.exists(target) and all(os.path.getmtime(target) > os.path.getmtime(d) for d in deps):
        return
    cmd = ["g++", "-O2", "-std=c++20", "-D_GLIBCXX_USE_CXX11_ABI=1", "-I" + t + "/include",
           "-I" + t + "/include/torch/csrc/api/include", src, "-o", target, "-L" + t + "/lib",
           "-Wl,-rpath," + t + "/lib", "-Wl,--no-as-needed", "-ltorch", "-ltorch_cpu", "-lc10"]
    print("building " + target + " against " + t, flush=True)
    subprocess.run(cmd, check=True)


def rows_of(cmd, env=None):
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    head = [l for l in out.stdout.splitlines() if not l.startswith("json: ") and not l.startswith("batch")]
    return [json.loads(l[6:]) for l in out.stdout.splitlines() if l.startswith("json: ")], head


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp", choices=["mlp", "conv"])
    ap.add_argument("--remat", default="build/default/bench/bench_inference")
    ap.add_argument("--torch-python", default=VENV_PYTHON)
    ap.add_argument("--batches", default=None, help="default: 1,16,256,4096 (conv: 1,16,256)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every program")
    ap.add_argument("--inner", type=int, default=5, help="timed rounds inside each program run")
    ap.add_argument("--seconds", type=float, default=0.2, help="per inner round and batch")
    ap.add_argument("--no-compile", action="store_true", help="leave out torch.compile")
    ap.add_argument("--out", default=None, help="default: bench/results/inference-host (conv: inference-conv-host)")
    args = ap.parse_args()
    conv = args.model == "conv"
    args.batches = args.batches or ("1,16,256" if conv else "1,16,256,4096")
    args.out = args.out or ("bench/results/inference-conv-host" if conv else "bench/results/inference-host")
    env = dict(os.environ, OMP_NUM_THREADS="2")
    libtorch = os.path.join(os.path.dirname(os.path.abspath(args.remat)), "bench_inference_libtorch")
    build_libtorch(args.torch_python, libtorch)
    common = ["--model", args.model, "--batches", args.batches, "--rounds", str(args.inner), "--seconds", str(args.seconds)]
    runs = {}  # (library, batch) -> [median latency per round]
    extra = {}
    heap = {}  # (library, batch) -> [malloc and its kin per call] (bench/heap_count.hpp)
    heads = []
    for r in range(args.rounds):
        progs = [[args.remat] + common, [libtorch] + common]
        if not args.no_compile:
            progs.append([args.torch_python, "-c", TORCH_COMPILE, str(args.seconds), str(args.inner), args.batches,
                          args.model, HERE])
        for cmd in progs:
            rows, head = rows_of(cmd, env)
            if r == 0:
                heads += head
            for row in rows:
                runs.setdefault((row["library"], row["batch"]), []).append(row["latency_us"])
                if "allocations_per_call" in row:
                    extra.setdefault((row["library"], row["batch"]), []).append(row["allocations_per_call"])
                if "heap_allocations_per_call" in row:
                    heap.setdefault((row["library"], row["batch"]), []).append(row["heap_allocations_per_call"])
        print("round %d of %d done" % (r + 1, args.rounds), flush=True)
    batches = [int(b) for b in args.batches.split(",")]
    libs = []
    for lib, _ in runs:
        if lib not in libs:
            libs.append(lib)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    stamp = datetime.date.today().isoformat()
    lines = ["<!-- %s, %s, %d cores, 2 threads; bench/compare_inference.py --rounds %d -->" %
             (stamp, cpu, os.cpu_count(), args.rounds)]
    lines += heads
    lines.append("")
    lines.append("| batch | library | latency (us) | rows/s | / libtorch | system allocations per call | "
                 "heap allocations per call |")
    lines.append("|---:|---|---:|---:|---:|---:|---:|")
    out_json = []
    lt = next((l for l in libs if l.startswith("libtorch")), None)
    for b in batches:
        base = statistics.median(runs[(lt, b)]) if lt and (lt, b) in runs else None
        for lib in libs:
            if (lib, b) not in runs:
                continue
            t = statistics.median(runs[(lib, b)])
            allocs = extra.get((lib, b))
            mallocs = heap.get((lib, b))
            ratio = "%.2f" % (t / base) if base else ""
            lines.append("| %d | %s | %.2f | %.0f | %s | %s | %s |" % (
                b, lib, t, b / (t * 1e-6), ratio, "%.3f" % max(allocs) if allocs else "not counted",
                "%.1f" % max(mallocs) if mallocs else "not counted"))
            out_json.append({"model": args.model, "batch": b, "library": lib, "latency_us": t, "rounds": runs[(lib, b)],
                             "vs_libtorch": t / base if base else None,
                             "allocations_per_call": max(allocs) if allocs else None,
                             "heap_allocations_per_call": max(mallocs) if mallocs else None, "cpu": cpu, "date": stamp})
    lines.append("")
    lines.append("Each latency is the median over %d interleaved runs of each program's median of %d timed rounds "
                 "of at least %.2f s. remat: model::forward(x, out) after reserve_inference(%d); libtorch: "
                 "module->forward(x) under torch::InferenceMode; torch.compile(dynamic=False) under "
                 "torch.inference_mode, from Python. System allocations: remat's allocators' requests for "
                 "memory (libtorch caches nothing on the CPU: each of its tensors is a posix_memalign, one of "
                 "its heap allocations); heap allocations: calls of malloc and its kin, over 100 more calls "
                 "(fewer past a second: bench/heap_count.hpp)." % (args.rounds, args.inner, args.seconds,
                                                  max(256, max(batches)) if conv else 4096))
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out + ".md", "w") as f:
        f.write(text)
    with open(args.out + ".jsonl", "w") as f:
        for row in out_json:
            f.write(json.dumps(row) + "\n")
    print("wrote %s.md and %s.jsonl" % (args.out, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
