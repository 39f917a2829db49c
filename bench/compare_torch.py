#!/usr/bin/python3
"""remat against PyTorch on the storage-policy benchmark, interleaved in one run.

The model (the same in both): a pre-norm residual MLP, block
    y = x + Linear(d, d)(GELU(Linear(d, d)(LayerNorm(x)))),   d = 1024,
N blocks, MSE against a fixed random target, AdamW, 2 threads; fp32, or with --precision bf16
remat's mixed<bfloat16> against PyTorch under torch.autocast('cpu', dtype=torch.bfloat16) (fp32
weights and optimizer in both).

For each configuration (batch, N) it runs, alternating between the libraries:
  remat:   stored, checkpoint (every block), checkpoint_sequential (round(sqrt N) runs, the last
           one stored as PyTorch's; --policies checkpoint_sequential_all checkpoints it too),
           revolve (round(sqrt N) slots), selective (keeps products, recomputes point-wise work)
  PyTorch: plain, checkpoint per block (use_reentrant=False), checkpoint_sequential with
           round(sqrt N) segments, selective (its selective activation checkpointing per block,
           PyTorch 2.4 and later: the matrix products' outputs kept, the rest recomputed, as
           remat's Selective; Debian's 1.13 has none, so its row is left out)
The anchor is today's PyTorch at its best: the version from PyPI that `scripts/setup.sh bench`
installs into .venv-bench (pinned there; --torch-python picks another interpreter), run in a child
process four ways: eager and torch.compile, each with glibc's default malloc and with
MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ raised (freed memory is not returned to the
system). The first round runs all four for each policy and keeps the fastest; later rounds
(--rounds) run that one, interleaved with remat, and every figure is the median over the rounds.
Its optimizer is its fused AdamW (`fused=True`, on the CPU too since PyTorch 2.4: 2.5-7x faster
there than its default loop). Debian's PyTorch 1.13 (/usr/bin/python3, as Debian ships it: eager,
its default BLAS) runs once per configuration as one more row, "as Debian ships it"; it is not the
anchor. Each child reports its version and the BLAS it loaded. Before the first round and after
the last, bench_peak (beside --remat's program) measures the processor's own ceiling for the
precision on one thread and on all: where all threads give well under their count times one,
another tenant held a core, and the header of the results says so.

Saved-activation memory: remat's is what its allocator holds when the forward ends (its plan
says the same); PyTorch's is the growth of glibc's heap (mallinfo2: arenas + mmapped blocks)
over the forward, minus the output, in an untimed step.

Writes bench/results/policies-host.jsonl (one line per configuration and library), .md (the
table) and .png (step time against saved-activation memory).

--workload gpt runs the transformer instead: GPT-2's pre-norm block (width 512, 8 heads, causal
attention: F.scaled_dot_product_attention in PyTorch 2.x, written out as in nanoGPT in 1.13, GELU
MLP of 4x width), sequences of 256 tokens, vocabulary 256, batch 16, N = 4, 8, 16 blocks,
cross-entropy on the next token. remat's GPTBlock has BlockedAttentionCore (attention in memory
linear in the sequence: it keeps no seq x seq probabilities, as PyTorch's
scaled_dot_product_attention keeps none). remat's policies gain recompute_attention (the core that
keeps the probabilities, AttentionCore, checkpointed: RecomputeAttention<StoredAttention<...>>) and
PyTorch's gain checkpoint_attention (torch.utils.checkpoint around the attention core alone).
--policies may also name stored_attention, checkpoint_sequential_stored_attention and
selective_stored_attention: stored, checkpoint_sequential and selective with AttentionCore, each
against the same PyTorch policy as without; and stored_dropout and checkpoint_dropout (the host
only): the GPT with GPT-2's dropout 0.1 (after the embeddings, on the attention probabilities, on
each residual branch), against --torch-policies plain_dropout and checkpoint_dropout, PyTorch's
same model (nn.Dropout, and scaled_dot_product_attention's dropout_p). Results go to bench/results/gpt-host.*. (Before
2026-12-07 remat's GPT policies had AttentionCore, and `blocked`, `checkpoint_sequential_blocked`
and `selective_blocked` were the blocked core's.)

  /usr/bin/python3 bench/compare_torch.py --remat build/default/bench/bench_policies [--precision bf16] [--quick]
  /usr/bin/python3 bench/compare_torch.py --workload gpt [--quick]

--device cuda runs both on the GPU (the mlp workload at d = 4096, batch 8192, N = 16 and 32; the
gpt workload at batch 64, N = 8): remat's bench_policies_cuda (built by the cuda preset) against
the machine's PyTorch on CUDA (torch.utils.checkpoint, torch.autocast('cuda', dtype=torch.bfloat16),
F.scaled_dot_product_attention, its fused AdamW), eager and torch.compile, the faster one the peer.
Saved activations on the GPU are torch.cuda.memory_allocated's growth over the forward; remat's
are its device allocator's. The GEMM peak is a cuBLASLt product of the model's shape (batch x d
times d x d) through remat, beside torch.mm of the same; remat's fused unscale/check/clip/AdamW
pass is reported against a device-to-device copy. On the GPU both also offload: remat's
Offloaded<Block> per block (pinned host memory, copies on a side stream) against PyTorch's
torch.autograd.graph.save_on_cpu(pin_memory=True). Results go to bench/results/policies-cuda*.

  python3 bench/compare_torch.py --device cuda --remat build/cuda/bench/bench_policies_cuda [--precision bf16]
"""
import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import time

from peer_common import (DEBIAN_PYTHON, TORCH_SETTINGS, add_peer_options, ceiling_text, chosen_peers, cpu_name,
                         fastest_adamw, heap_in_use, loaded_blas, processor_ceiling)

D = 1024
POLICIES_REMAT = ["stored", "checkpoint", "checkpoint_sequential", "revolve", "selective"]
POLICIES_TORCH = ["plain", "checkpoint", "checkpoint_sequential", "selective"]
# The PyTorch policy each remat policy is compared with.
PEER = {"stored": "plain", "checkpoint": "checkpoint", "checkpoint_sequential": "checkpoint_sequential",
        "checkpoint_sequential_all": "checkpoint_sequential",
        "revolve": "checkpoint_sequential", "selective": "selective", "recompute_attention": "checkpoint_attention",
        "offload": "offload",
        # The GPT with AttentionCore, which keeps the seq x seq probabilities, against the same PyTorch
        # policies (whose F.scaled_dot_product_attention keeps none, as remat's default blocked core).
        "stored_attention": "plain", "checkpoint_sequential_stored_attention": "checkpoint_sequential",
        "selective_stored_attention": "selective",
        # (the names of the blocked core's policies in results from before 2026-12-07)
        "blocked": "plain", "checkpoint_sequential_blocked": "checkpoint_sequential",
        "selective_blocked": "selective",
        # The GPT with GPT-2's dropout 0.1 (host only), against PyTorch's same model with nn.Dropout
        # and scaled_dot_product_attention's dropout_p.
        "stored_dropout": "plain_dropout", "checkpoint_dropout": "checkpoint_dropout"}
# remat's GPT policies with AttentionCore (bench_policies --workload gpt; on the GPU the first only).
KEPT = ("stored_attention", "checkpoint_sequential_stored_attention", "selective_stored_attention")
# remat's GPT policies with dropout 0.1, and their PyTorch peers (both only when asked for).
DROPOUT = ("stored_dropout", "checkpoint_dropout")
DROPOUT_TORCH = ("plain_dropout", "checkpoint_dropout")
P_DROP = 0.1
# The GPT workload.
GW, GH, GT, GV = 512, 8, 256, 256
OPENMP_BLAS = "/usr/lib/x86_64-linux-gnu/openblas-openmp"


def root(n):
    return int(math.floor(math.sqrt(n) + 0.5))


# ---------------------------------------------------------------- the PyTorch side (a child)


def built_blas(torch):
    """The BLAS PyTorch was built with (its BLAS_INFO: mkl for the PyPI wheels on x86)."""
    import re
    m = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    return m.group(1) if m else "?"


def gpt_flop(batch, n):
    """Model FLOP of a training step of the GPT workload (as bench_policies counts them)."""
    tokens = batch * GT
    per_block = 3 * tokens * (24.0 * GW * GW + 4.0 * GT * GW)
    return n * per_block + 3 * 2.0 * tokens * GW * GV


def reentrant_free(fn):
    """use_reentrant=False where the function takes it (PyTorch 2.x; 1.13's is reentrant only)."""
    import inspect
    return {"use_reentrant": False} if "use_reentrant" in inspect.signature(fn).parameters else {}


NO_SELECTIVE = 4  # a child's exit status where its PyTorch has no selective activation checkpointing


def per_block(torch, policy):
    """f(block, x) for the policies that wrap each block: checkpoint (torch.utils.checkpoint,
    use_reentrant=False) and selective (below); None for the others."""
    if policy == "checkpoint":
        from torch.utils.checkpoint import checkpoint
        return lambda block, x: checkpoint(block, x, use_reentrant=False)
    return selective_checkpoint(torch) if policy == "selective" else None


def selective_checkpoint(torch):
    """f(block, x): torch.utils.checkpoint around the block with PyTorch's selective activation
    checkpointing (2.4 and later), which keeps the outputs of the matrix products (mm, addmm, bmm)
    and recomputes everything else in backward: remat's Selective. A child whose PyTorch has none
    exits with NO_SELECTIVE."""
    import functools
    try:
        from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
    except ImportError:
        print(f"PyTorch {torch.__version__} has no selective activation checkpointing", file=sys.stderr)
        sys.exit(NO_SELECTIVE)
    aten = torch.ops.aten
    context = functools.partial(create_selective_checkpoint_contexts,
                                [aten.mm.default, aten.addmm.default, aten.bmm.default])
    return lambda block, x: checkpoint(block, x, use_reentrant=False, context_fn=context)


def gpt_model(policy, n):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint, checkpoint_sequential

    # *_dropout: the same model with GPT-2's dropout (nanoGPT's places: after the embeddings, on
    # the attention probabilities, on each residual branch), the policy without the suffix
    p = P_DROP if policy.endswith("_dropout") else 0.0
    policy = policy.removesuffix("_dropout")
    sdpa = getattr(F, "scaled_dot_product_attention", None)  # PyTorch 2.x: its fused (flash) attention
    wrap = per_block(torch, policy)

    def attention_core(qkv, training):
        b, t, _ = qkv.shape
        q, k, v = qkv.split(GW, dim=2)
        q, k, v = (z.reshape(b, t, GH, GW // GH).transpose(1, 2) for z in (q, k, v))
        if sdpa is not None:
            return sdpa(q, k, v, is_causal=True, dropout_p=p if training else 0.0).transpose(1, 2).reshape(b, t, GW)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(GW // GH))
        mask = torch.ones(t, t, dtype=torch.bool, device=qkv.device).tril()
        probs = F.dropout(torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1), p, training)
        y = probs @ v
        return y.transpose(1, 2).reshape(b, t, GW)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.qkv, self.proj = nn.LayerNorm(GW), nn.Linear(GW, 3 * GW), nn.Linear(GW, GW)
            self.ln2, self.fc1, self.fc2 = nn.LayerNorm(GW), nn.Linear(GW, 4 * GW), nn.Linear(4 * GW, GW)
            self.drop = nn.Dropout(p)

        def forward(self, x):
            qkv = self.qkv(self.ln1(x))
            if policy == "checkpoint_attention":
                a = checkpoint(attention_core, qkv, self.training, use_reentrant=False)
            else:
                a = attention_core(qkv, self.training)
            x = x + self.drop(self.proj(a))
            return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(GV, GW), nn.Embedding(GT, GW)
            self.drop = nn.Dropout(p)
            self.blocks = nn.Sequential(*[Block() for _ in range(n)])
            self.ln, self.head = nn.LayerNorm(GW), nn.Linear(GW, GV)

        def forward(self, ids):
            h = self.drop(self.wte(ids) + self.wpe.weight[: ids.shape[1]])
            if wrap:
                for b in self.blocks:
                    h = wrap(b, h)
            elif policy == "checkpoint_sequential":
                h = checkpoint_sequential(self.blocks, root(n), h, **reentrant_free(checkpoint_sequential))
            else:
                h = self.blocks(h)
            return self.head(self.ln(h))

    return GPT()


def torch_worker(args):
    import torch
    import torch.nn as nn
    from torch.utils.checkpoint import checkpoint_sequential

    global D
    if args.device == "cuda" and args.workload == "mlp":
        D = 4096
    dev = args.device if args.device == "cuda" else "cpu"
    torch.set_num_threads(2)
    torch.manual_seed(1)
    if args.workload == "gpt":
        return torch_worker_gpt(args, torch)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(D)
            self.fc1 = nn.Linear(D, D)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(D, D)

        def forward(self, x):
            return x + self.fc2(self.act(self.fc1(self.norm(x))))

    n, batch, policy = args.blocks, args.batch, args.policy
    net = nn.Sequential(*[Block() for _ in range(n)]).to(dev)
    # The peer at its best: PyTorch's fused (single-kernel) AdamW, on the CPU too where it has one.
    opt = fastest_adamw(torch, net.parameters(), 1e-4)
    x = torch.rand(batch, D, device=dev) * 2 - 1
    t = torch.rand(batch, D, device=dev) * 2 - 1
    if policy == "checkpoint_sequential":
        # PyTorch 1.13's checkpoint_sequential is reentrant only: with an input that needs no
        # gradient no parameter before the last segment would get one. Its documented remedy:
        x.requires_grad_(True)
    wrap = per_block(torch, policy)

    def forward():
        if policy == "plain":
            return net(x)
        if wrap:
            h = x
            for b in net:
                h = wrap(b, h)
            return h
        if policy == "offload":  # every saved tensor to (pinned) host memory, back in backward
            with torch.autograd.graph.save_on_cpu(pin_memory=dev == "cuda"):
                return net(x)
        return checkpoint_sequential(net, root(n), x, **reentrant_free(checkpoint_sequential))

    bf16 = args.precision == "bf16"

    def loss_of():
        if bf16:
            with torch.autocast(dev, dtype=torch.bfloat16):
                return nn.functional.mse_loss(forward().float(), t)
        return nn.functional.mse_loss(forward(), t)

    gemm = 2.0 * batch * D * D
    measure(args, torch, net, forward, loss_of, opt, n * 2 * 3 * gemm, "mlp", D)


def torch_worker_gpt(args, torch):
    import torch.nn.functional as F
    n, batch, policy = args.blocks, args.batch, args.policy
    dev = "cuda" if args.device == "cuda" else "cpu"
    net = gpt_model(policy, n).to(dev)
    opt = fastest_adamw(torch, net.parameters(), 1e-4)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, GV, (batch, GT), generator=g).to(dev)
    targets = torch.randint(0, GV, (batch, GT), generator=g).to(dev)
    bf16 = args.precision == "bf16"

    def forward():
        return net(ids)

    def loss_of():
        if bf16:
            with torch.autocast(dev, dtype=torch.bfloat16):
                return F.cross_entropy(forward().float().reshape(-1, GV), targets.reshape(-1))
        return F.cross_entropy(forward().reshape(-1, GV), targets.reshape(-1))

    measure(args, torch, net, forward, loss_of, opt, gpt_flop(batch, n), "gpt", GW)


def measure(args, torch, net, forward, loss_of, opt, flop, workload, width):
    """Saved activations (heap growth over an untimed forward) and the median step time."""
    n, batch, policy = args.blocks, args.batch, args.policy
    bf16 = args.precision == "bf16"
    # torch.compile: the loss (forward, checkpoints included) as one compiled graph; the backward
    # is compiled with it (AOTAutograd). It compiles in the untimed steps.
    compiled = torch.compile(loss_of) if args.compile else loss_of

    def step():
        opt.zero_grad(set_to_none=True)
        loss = compiled()
        loss.backward()
        opt.step()
        return loss.item()

    cuda = args.device == "cuda"
    dev = "cuda" if cuda else "cpu"

    def in_use():
        return torch.cuda.memory_allocated() if cuda else heap_in_use()

    t_first = time.perf_counter()
    for _ in range(2):
        step()
    first_steps_s = time.perf_counter() - t_first
    before = in_use()
    if bf16:
        with torch.autocast(dev, dtype=torch.bfloat16):
            y = forward()
    else:
        y = forward()
    grown = in_use() - before
    saved = grown - y.numel() * y.element_size()
    del y

    times = []
    for k in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        loss = step()
        t1 = time.perf_counter()
        if k >= args.warmup:
            times.append(t1 - t0)
    # checkpoint_sequential checkpoints the first K - 1 segments of N // K blocks; the last is stored.
    recomputed = {"plain": 0, "offload": 0, "checkpoint": n, "checkpoint_attention": n, "selective": n,
                  "checkpoint_sequential": (root(n) - 1) * (n // root(n))}[policy.removesuffix("_dropout")]
    # torch.mm of the model's product shape on the GPU, 1024^3 on the host.
    mm_m, mm_n = (batch * (GT if workload == "gpt" else 1), width) if cuda else (1024, 1024)
    a = torch.rand(mm_m, mm_n, dtype=torch.bfloat16 if bf16 else torch.float32, device=dev)
    b = torch.rand(mm_n, mm_n, dtype=a.dtype, device=dev)
    mm = []
    for k in range(12):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        torch.mm(a, b)
        if cuda:
            torch.cuda.synchronize()
        mm.append(time.perf_counter() - t0)
    out = {"library": "pytorch", "workload": workload, "policy": policy, "blocks": n, "batch": batch,
           "seq": GT if workload == "gpt" else 1, "width": width,
           "precision": args.precision,
           "threads": torch.get_num_threads(), "steps": args.steps, "step_s": statistics.median(times),
           "model_gflop": flop * 1e-9, "model_gflops": flop / statistics.median(times) * 1e-9,
           "saved_activation_bytes": saved, "recomputed_block_forwards": recomputed, "loss": loss,
           "torch_mm_gflops": 2.0 * mm_m * mm_n * mm_n / statistics.median(mm[2:]) * 1e-9,
           "device": torch.cuda.get_device_name() if cuda else "cpu",
           "malloc_tuned": "MALLOC_MMAP_THRESHOLD_" in os.environ, "blas": loaded_blas(), "blas_info": built_blas(torch),
           "torch_version": torch.__version__, "compiled": bool(args.compile), "first_steps_s": first_steps_s,
           "adamw": "fused" if opt.defaults.get("fused") else "for-each loop"}
    print("json: " + json.dumps(out), flush=True)


# ---------------------------------------------------------------- the driver

def run_remat(binary, batch, n, policy, steps, warmup, precision, workload):
    env = dict(os.environ, OMP_NUM_THREADS="2")
    out = subprocess.run([binary, "--workload", workload, "--batch", str(batch), "--blocks", str(n), "--policy",
                          policy, "--steps", str(steps), "--warmup", str(warmup), "--precision", precision], env=env,
                         capture_output=True, text=True)
    if out.returncode not in (0, 3):
        sys.exit(f"{binary} failed: {out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_torch(batch, n, policy, steps, warmup, extra_env, precision, workload, device="host", python=None,
              compile=False):
    env = dict(os.environ, **extra_env)
    out = subprocess.run([python or sys.executable, __file__, "--torch-worker", "--workload", workload, "--device",
                          device, "--batch", str(batch), "--blocks", str(n),
                          "--policy", policy, "--steps", str(steps), "--warmup", str(warmup),
                          "--precision", precision] + (["--compile"] if compile else []),
                         env=env, capture_output=True, text=True)
    if out.returncode == NO_SELECTIVE:
        print(f"    ({out.stderr.strip().splitlines()[-1]}: its {policy} row is left out)", flush=True)
        return None
    if out.returncode != 0:
        if compile:  # a policy torch.compile cannot take: that way is left out, and said so
            print(f"    (torch.compile failed for {policy}: {out.stderr.strip().splitlines()[-1:]})", flush=True)
            return None
        sys.exit(f"PyTorch worker failed: {out.stderr}")
    line = [l for l in out.stdout.splitlines() if l.startswith("json: ")][-1]
    return json.loads(line[6:])


def mib(b):
    return b / 2 ** 20


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--remat", default="build/default/bench/bench_policies")
    ap.add_argument("--out", default=None, help="default: bench/results/policies-host (gpt: gpt-host)")
    ap.add_argument("--workload", default="mlp", choices=["mlp", "gpt"])
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 5; gpt 3)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 2; gpt 1)")
    ap.add_argument("--quick", action="store_true", help="one small configuration, one step: a smoke test")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--policy", default="plain")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--device", default="host", choices=["host", "cuda"])
    ap.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=1,
                    help="interleaved rounds; each figure is the median over them (the first picks PyTorch's setting)")
    add_peer_options(ap)
    ap.add_argument("--policies", default=None, help="only these remat policies, e.g. stored,checkpoint")
    ap.add_argument("--torch-policies", default=None, help="only these PyTorch policies, e.g. plain,checkpoint")
    ap.add_argument("--replot", action="store_true", help="redraw OUT.png from OUT.jsonl, run nothing")
    ap.add_argument("--configs", default=None,
                    help="only these batch x blocks configurations, e.g. 256x8,2048x16 (default: the full sweep)")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    if cuda and args.workload == "mlp":
        global D
        D = 4096
        if args.remat == ap.get_default("remat"):
            args.remat = "build/cuda/bench/bench_policies_cuda"
    gpt = args.workload == "gpt"
    if args.steps is None:
        args.steps = 3 if gpt else 5
    if args.warmup is None:
        args.warmup = 1 if gpt else 2
    if args.torch_worker:
        return torch_worker(args)
    if args.out is None:
        args.out = "bench/results/" + ("gpt-" if gpt else "policies-") + ("cuda" if cuda else "host") + (
            "-bf16" if args.precision == "bf16" else "")

    configs = [(256, 8), (256, 16), (256, 32), (256, 64), (2048, 16)]
    if args.precision == "bf16":
        configs = [(256, 8), (256, 16), (256, 32), (2048, 16)]
    policies_remat, policies_torch = POLICIES_REMAT, POLICIES_TORCH
    if gpt:
        configs = [(16, 4), (16, 8), (16, 16)]
        policies_remat = POLICIES_REMAT + ["recompute_attention"]
        policies_torch = POLICIES_TORCH + ["checkpoint_attention"]
    settings = TORCH_SETTINGS
    python, debian = chosen_peers(args)
    debian = debian and not cuda
    if cuda:  # the machine's own PyTorch, eager and compiled
        configs = [(64, 8)] if gpt else [(8192, 16), (8192, 32)]
        settings = [s for s in TORCH_SETTINGS if not s[1]]
        python = args.torch_python or sys.executable
        policies_remat, policies_torch = policies_remat + ["offload"], policies_torch + ["offload"]
    if args.replot:
        rows = [json.loads(l) for l in open(args.out + ".jsonl")]
        cfg = sorted({(r["batch"], r["blocks"]) for r in rows})
        found = list(dict.fromkeys(r["policy"] for r in rows if r["library"] == "remat"))
        plot(rows, cfg, found, policies_torch + ["offload"], args, gpt, cuda, rows[0].get("cpu", "?"))
        return
    if args.configs:
        configs = [tuple(int(v) for v in c.split("x")) for c in args.configs.split(",")]
    if args.policies:  # (checkpoint_sequential_all and AttentionCore's policies only when asked for)
        asked_for = ["checkpoint_sequential_all"] + (list(KEPT[:1] if cuda else KEPT + DROPOUT) if gpt else [])
        policies_remat = [p for p in policies_remat + asked_for if p in args.policies.split(",")]
    if args.torch_policies:
        asked_for = list(DROPOUT_TORCH) if gpt and not cuda else []
        policies_torch = [p for p in policies_torch + asked_for if p in args.torch_policies.split(",")]
    if args.quick:
        configs, args.steps, args.warmup = [(2 if gpt else 64, 4)] if not cuda else [(8, 8) if gpt else (512, 16)], 1, 1

    peak_batch = str(configs[0][0])
    peaks = [json.loads(l) for l in subprocess.run(
        [args.remat, "--gemm-peak", "--precision", args.precision, "--batch", peak_batch], capture_output=True,
        text=True, env=dict(os.environ, OMP_NUM_THREADS="2")).stdout.strip().splitlines()]
    for p in peaks:
        print(f"{p['precision']} {p['m']} x {p['n']} x {p['k']} product through remat ({p['path']}): "
              f"{p['gflops']:.1f} GFLOP/s")
    optimizer = None
    if cuda:
        optimizer = json.loads(subprocess.run([args.remat, "--optimizer-bandwidth", "--precision", args.precision],
                                              capture_output=True, text=True).stdout.strip().splitlines()[-1])
        print(f"fused unscale/check/clip/AdamW: {optimizer['step_gbps']:.0f} GB/s, "
              f"{optimizer['fraction_of_copy']:.0%} of a device-to-device copy ({optimizer['copy_gbps']:.0f} GB/s)")
    peak = max(peaks, key=lambda p: p["gflops"])  # the path remat takes
    # The processor's own ceiling before and after the runs (not in --quick): whether another
    # tenant held a core meanwhile.
    measure_ceiling = not cuda and not args.quick
    ceiling_before = processor_ceiling(args.remat, args.precision) if measure_ceiling else None
    if measure_ceiling:
        print(f"the processor's {args.precision} ceiling before (bench_peak): {ceiling_text(ceiling_before)}",
              flush=True)
    rounds = {}  # (library, batch, n, policy) -> the runs of each round
    chosen = {}  # (batch, n, PyTorch policy) -> the setting its first round found fastest
    debian_rows = []

    def remat_run(batch, n, p):
        r = run_remat(args.remat, batch, n, p, args.steps, args.warmup, args.precision, args.workload)
        rounds.setdefault(("remat", batch, n, p), []).append(r)
        print(f"  remat   N={n:3d} batch={batch:5d} {p:22s} {r['step_s']:.4f} s", flush=True)

    def torch_run(batch, n, tp):
        ways = [w for w in settings if chosen.get((batch, n, tp), w[0]) == w[0]]
        runs = []
        for name, extra, comp in ways:
            r = run_torch(batch, n, tp, args.steps, args.warmup, extra, args.precision, args.workload, args.device,
                          python, comp)
            if r is not None:
                runs.append(dict(r, setting=name))
        if not runs:
            return
        best = min(runs, key=lambda r: r["step_s"])
        chosen[(batch, n, tp)] = best["setting"]
        rounds.setdefault(("pytorch", batch, n, tp), []).append(
            dict(best, settings={r["setting"]: r["step_s"] for r in runs}))
        print(f"  pytorch N={n:3d} batch={batch:5d} {tp:22s} " +
              ", ".join(f"{r['step_s']:.4f} s {r['setting']}" for r in runs) +
              f"; best: {best['setting']} (PyTorch {best['torch_version']}, "
              f"BLAS {os.path.basename(best['blas'][-1]) if best['blas'] else best['blas_info']})", flush=True)

    for rnd in range(args.rounds):
        for batch, n in configs:
            pending = list(policies_remat)
            for tp in policies_torch:  # interleave: a remat policy, then a PyTorch one
                if pending:
                    remat_run(batch, n, pending.pop(0))
                torch_run(batch, n, tp)
                if debian and rnd == 0:
                    r = run_torch(batch, n, tp, args.steps, args.warmup, {}, args.precision, args.workload,
                                  args.device, DEBIAN_PYTHON)
                    if r is None:
                        continue
                    debian_rows.append(dict(r, library="pytorch-debian", setting="as Debian ships it"))
                    print(f"  pytorch N={n:3d} batch={batch:5d} {tp:22s} {r['step_s']:.4f} s as Debian ships it "
                          f"({r['torch_version']})", flush=True)
            for p in pending:
                remat_run(batch, n, p)

    ceiling_after = processor_ceiling(args.remat, args.precision) if measure_ceiling else None
    if measure_ceiling:
        print(f"the processor's {args.precision} ceiling after (bench_peak): {ceiling_text(ceiling_after)}",
              flush=True)

    # Each figure: the median over the rounds (the row of the median-time round, its time the median).
    rows = []
    for (lib, batch, n, p), runs in rounds.items():
        mid = sorted(runs, key=lambda r: r["step_s"])[len(runs) // 2]
        rows.append(dict(mid, step_s=statistics.median(r["step_s"] for r in runs),
                         rounds_s=[r["step_s"] for r in runs],
                         model_gflops=mid["model_gflop"] / statistics.median(r["step_s"] for r in runs)))
    rows += debian_rows

    for r in rows:
        r["gemm_peak_gflops"] = peak["gflops"]
        r["processor_ceiling"] = {"before": ceiling_before, "after": ceiling_after}
        r["fraction_of_gemm_peak"] = r["model_gflops"] / peak["gflops"]
        if r["library"] == "remat":
            peer = next((q for q in rows if q["library"] == "pytorch" and q["blocks"] == r["blocks"]
                         and q["batch"] == r["batch"] and q["policy"] == PEER[r["policy"]]), None)
            r["peer_policy"] = peer["policy"] if peer else None
            r["time_ratio_vs_pytorch"] = r["step_s"] / peer["step_s"] if peer else None
            # (None where the peer keeps nothing on the device: save_on_cpu moves every saved tensor)
            r["saved_ratio_vs_pytorch"] = (r["saved_activation_bytes"] / peer["saved_activation_bytes"]
                                           if peer and peer["saved_activation_bytes"] > 0 else None)
            stored = next((q for q in rows if q["library"] == "remat" and q["policy"] == "stored"
                           and q["blocks"] == r["blocks"] and q["batch"] == r["batch"]), r)
            r["time_vs_stored"] = r["step_s"] / stored["step_s"]
            r["saved_vs_stored"] = r["saved_activation_bytes"] / stored["saved_activation_bytes"]
            old = next((q for q in rows if q["library"] == "pytorch-debian" and q["blocks"] == r["blocks"]
                        and q["batch"] == r["batch"] and q["policy"] == PEER[r["policy"]]), None)
            r["time_ratio_vs_debian_pytorch"] = r["step_s"] / old["step_s"] if old else None
    order = {"remat": 0, "pytorch": 1, "pytorch-debian": 2}
    rows.sort(key=lambda r: (r["batch"], r["blocks"], order[r["library"]]))

    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    torch_version = next((r["torch_version"] for r in rows if r["library"] == "pytorch"), "?")
    torch_blas = next((os.path.basename(r["blas"][-1]) if r["blas"] else r.get("blas_info", "?") for r in rows
                       if r["library"] == "pytorch"), "?")
    stamp = datetime.date.today().isoformat()
    cpu = cpu_name()
    if cuda:
        cpu = next((r["device"] for r in rows if r["library"] == "pytorch"), "GPU")
    with open(args.out + ".jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(dict(r, date=stamp, cpu=cpu)) + "\n")

    lines = [f"<!-- {stamp}, {cpu}, {os.cpu_count()} cores, 2 threads; "
             f"/usr/bin/python3 bench/compare_torch.py (scripts/bench.sh) -->" if not cuda else
             f"<!-- {stamp}, {cpu}; python3 bench/compare_torch.py --device cuda -->",
             f"{args.precision} {peak['m']} x {peak['n']} x {peak['k']} product peak through remat ({peak['path']}): "
             f"{peak['gflops']:.0f} GFLOP/s"
             + f"; PyTorch's torch.mm of the same: "
             f"{statistics.median(r['torch_mm_gflops'] for r in rows if r['library'] == 'pytorch'):.0f} GFLOP/s "
             f"(PyTorch {torch_version}, BLAS {torch_blas})"
             ". Model GFLOP/s count the stored model's products "
             f"only, so recomputation shows as a lower rate."
             + (f" The processor's {args.precision} ceiling (bench_peak) before the runs: "
                f"{ceiling_text(ceiling_before)}; after: {ceiling_text(ceiling_after)}."
                if measure_ceiling else ""), "",
             "| batch | N | library | policy | step (s) | vs remat stored | GFLOP/s | of GEMM peak | saved act. (MiB) "
             f"| plan (MiB) | peak act. (MiB) | recomputed blocks | time / PyTorch {torch_version} | saved / PyTorch "
             f"| time / Debian's |",
             "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    notes = sorted({r["setting"] for r in rows if r["library"] == "pytorch"})
    library_names = {"remat": "remat", "pytorch": f"PyTorch {torch_version}",
                     "pytorch-debian": "PyTorch " + next((r["torch_version"] for r in rows
                                                          if r["library"] == "pytorch-debian"), "") +
                                       " as Debian ships it"}
    for r in rows:
        remat = r["library"] == "remat"
        lines.append("| {} | {} | {} | {} | {:.3f} | {} | {:.0f} | {:.0%} | {:.1f} | {} | {} | {} | {} | {} | {} |".format(
            r["batch"], r["blocks"], library_names[r["library"]] + (f" ({r['setting']})" if r["library"] == "pytorch"
                                                                    else ""), r["policy"], r["step_s"],
            f"{r['time_vs_stored']:.2f}" if remat else "", r["model_gflops"], r["fraction_of_gemm_peak"],
            mib(r["saved_activation_bytes"]), f"{mib(r['planned_saved_bytes']):.1f}" if remat else "",
            f"{mib(r['peak_activation_bytes']):.1f}" if remat else "", r["recomputed_block_forwards"],
            f"{r['time_ratio_vs_pytorch']:.2f} ({r['peer_policy']})" if remat and r["peer_policy"] else "",
            ("n/a (PyTorch keeps 0 on the device)" if r['saved_ratio_vs_pytorch'] is None
             else f"{r['saved_ratio_vs_pytorch']:.2f}") if remat and r["peer_policy"] else "",
            f"{r['time_ratio_vs_debian_pytorch']:.2f}" if remat and r.get("time_ratio_vs_debian_pytorch") else ""))
    lines.append("")
    if optimizer:
        lines.append(f"Fused unscale/check/clip/AdamW pass: {optimizer['step_gbps']:.0f} GB/s, "
                     f"{optimizer['fraction_of_copy']:.0%} of a device-to-device copy "
                     f"({optimizer['copy_gbps']:.0f} GB/s).")
        lines.append("")
    lines.append(f"PyTorch {torch_version} rows are its fastest of: " + ", ".join(w[0] for w in settings) +
                 " (fastest here: " + ", ".join(notes) + f"), chosen in the first of {args.rounds} interleaved "
                 "round(s); each time is the median over the rounds, every round's time is in the JSON lines. "
                 f"Its AdamW: {next((r.get('adamw', '?') for r in rows if r['library'] == 'pytorch'), '?')}.")
    if args.precision == "bf16":
        lines.append("")
        lines.append("remat's saved activations in bf16 against the same model in fp32 (its plan): " + ", ".join(
            f"N={r['blocks']} batch {r['batch']} {r['policy']} {r['saved_activation_bytes'] / r['fp32_planned_saved_bytes']:.2f}"
            for r in rows if r["library"] == "remat" and r.get("fp32_planned_saved_bytes")))
    table = "\n".join(lines) + "\n"
    with open(args.out + ".md", "w") as f:
        f.write(table)
    print(table)

    plot(rows, configs, policies_remat, policies_torch, args, gpt, cuda, cpu)


def plot(rows, configs, policies_remat, policies_torch, args, gpt, cuda, cpu):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not found (Debian: python3-matplotlib): no plot")
        return
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    markers = {"stored": "o", "plain": "o", "checkpoint": "s", "checkpoint_sequential": "^",
               "checkpoint_sequential_all": "<", "revolve": "D",
               "selective": "P", "recompute_attention": "X", "checkpoint_attention": "X", "offload": "v",
               "stored_attention": "h", "checkpoint_sequential_stored_attention": ">",
               "selective_stored_attention": "*", "blocked": "h", "checkpoint_sequential_blocked": ">",
               "selective_blocked": "*", "stored_dropout": "p", "plain_dropout": "p", "checkpoint_dropout": "d"}
    for ax, batch in zip(axes, sorted({b for b, _ in configs})):
        for lib, color in (("remat", "tab:blue"), ("pytorch", "tab:orange")):
            for pol in (policies_remat if lib == "remat" else policies_torch):
                pts = [r for r in rows if r["library"] == lib and r["policy"] == pol and r["batch"] == batch]
                if not pts:
                    continue
                ax.scatter([mib(r["saved_activation_bytes"]) for r in pts], [r["step_s"] for r in pts],
                           marker=markers[pol], color=color, label=f"{lib} {pol}")
                for r in pts:
                    ax.annotate(f"N={r['blocks']}", (mib(r["saved_activation_bytes"]), r["step_s"]), fontsize=6,
                                xytext=(3, 2), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("saved activations (MiB)")
        ax.set_ylabel("step time (s)")
        ax.set_title(f"GPT, width {GW}, {GH} heads, seq {GT}, batch {batch}, {args.precision}, 2 threads" if gpt
                     else f"residual MLP, d = {D}, batch {batch}, {args.precision}, "
                     + (cpu if cuda else "2 threads"))
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out + ".png", dpi=110)
    print(f"wrote {args.out}.jsonl, .md and .png")


if __name__ == "__main__":
    main()
