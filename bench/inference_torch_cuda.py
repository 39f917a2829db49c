#!/usr/bin/env python3
"""PyTorch's side of bench_inference_cuda: the same surrogates, fp32 (no TF32), on the GPU, each call
waited for (torch.cuda.synchronize), three ways like remat's:
  eager    net(x) under torch.inference_mode
  graph    a torch.cuda.CUDAGraph of net on static tensors: x copied in, replayed, the output copied
           out (what remat's inference_graph::run does)
  replay   the graph's replay alone
Prints JSON lines in bench_inference's format ("library": "pytorch").

  python3 bench/inference_torch_cuda.py [--model mlp|conv] [--batches 1,16,256,4096] [--rounds 7] [--seconds 0.2]
                                        [--profile]
--profile prints, instead, the GPU kernels of 20 eager calls per batch (torch.profiler: name, calls,
microseconds per call of the network), to set beside remat's (bench/conv_algos_cuda.cu,
REMAT_BENCH_PROFILE=1 bench_inference_cuda), and the time of each convolution alone with cuDNN's
heuristic and with its benchmark mode (torch.backends.cudnn.benchmark).
"""
import argparse
import json
import time

import torch

from surrogates_torch import surrogate


def per_call(call, rounds, seconds):
    per = []
    calls = 0
    for _ in range(rounds):
        n, t0 = 0, time.perf_counter()
        while True:
            call()
            torch.cuda.synchronize()
            n += 1
            if n >= 5 and time.perf_counter() - t0 >= seconds:
                break
        per.append((time.perf_counter() - t0) / n)
        calls += n
    per.sort()
    return per[len(per) // 2], calls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp", choices=["mlp", "conv"])
    ap.add_argument("--batches", default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=float, default=0.2)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1)
    batches = [int(b) for b in (a.batches or ("1,16,256" if a.model == "conv" else "1,16,256,4096")).split(",")]
    net, x = surrogate(a.model, "cuda", max(batches + [256 if a.model == "conv" else 4096]))
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}, {a.model}, fp32 without TF32")

    def line(mode, b, t, calls):
        print(f"batch {b:5d} {mode:8s}: {t * 1e6:10.2f} us per call, {b / t:12.0f} rows/s ({calls} calls)")
        print("json: " + json.dumps({"library": "pytorch", "version": torch.__version__, "model": a.model,
                                     "device": "cuda", "mode": mode, "batch": b, "latency_us": round(t * 1e6, 3),
                                     "rows_per_s": round(b / t, 1), "calls": calls, "rounds": a.rounds}))

    if a.profile:
        return profile(net, x, batches)
    with torch.inference_mode():
        for b in batches:
            xb = x[:b].contiguous()
            out = torch.empty_like(net(xb))
            for _ in range(20):
                net(xb)
            torch.cuda.synchronize()
            line("eager", b, *per_call(lambda: out.copy_(net(xb)), a.rounds, a.seconds))
            static_in = xb.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    net(static_in)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static_out = net(static_in)

            def run():
                static_in.copy_(xb)
                g.replay()
                out.copy_(static_out)

            for _ in range(20):
                run()
            torch.cuda.synchronize()
            if not torch.equal(out, net(xb)):
                print(f"  (the graph's output differs from eager at batch {b})")
            line("graph", b, *per_call(run, a.rounds, a.seconds))
            line("replay", b, *per_call(g.replay, a.rounds, a.seconds))


def profile(net, x, batches):
    from torch.profiler import ProfilerActivity, profile as torch_profile
    calls = 20
    with torch.inference_mode():
        for b in batches:
            xb = x[:b].contiguous()
            for _ in range(20):
                net(xb)
            torch.cuda.synchronize()
            with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    net(xb)
                torch.cuda.synchronize()
            kernels = {}
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    n, us = kernels.get(e.name, (0, 0.0))
                    kernels[e.name] = (n + 1, us + e.device_time)
            total = sum(us for _, us in kernels.values())
            print(f"batch {b}: GPU kernels {total / calls:.1f} us per call")
            for name, (n, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1]):
                print(f"  {us / calls:9.1f} us {n // calls:3d} x  {name[:150]}")
            convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
            seen = set()
            for m in convs:
                key = (m.in_channels, m.out_channels)
                if key in seen:
                    continue
                seen.add(key)
                inp = torch.sin(torch.arange(b * m.in_channels * 64 * 64, device=x.device, dtype=torch.float32)
                                ).reshape(b, m.in_channels, 64, 64)
                for bench_mode in (False, True):
                    torch.backends.cudnn.benchmark = bench_mode
                    for _ in range(10):
                        m(inp)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(100):
                        m(inp)
                    torch.cuda.synchronize()
                    print(f"  conv {key[0]} -> {key[1]}, cudnn.benchmark={bench_mode}: "
                          f"{(time.perf_counter() - t0) * 1e4:.1f} us")
                torch.backends.cudnn.benchmark = False


if __name__ == "__main__":
    main()
