#!/usr/bin/env bash
# Data-parallel scaling of the residual-MLP step (d = 1024, 8 blocks, global batch 256) from one
# process to two MPI ranks on this machine, remat (bench_dist) beside PyTorch's
# DistributedDataParallel over gloo (bench/ddp_torch.py), interleaved. Writes
# bench/results/dist-host.{md,jsonl}.
#
#   bash bench/dist_scaling.sh [build/default/bench/bench_dist]
#
# Two cores: one process uses both through OpenMP threads; two ranks get one core (one thread)
# each. Scaling here measures what splitting the batch across processes costs and saves against
# threads, not what more machines give (see docs/distributed.md, "Scaling, here and on a cluster").
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-build/default/bench/bench_dist}"
out=bench/results/dist-host
mkdir -p bench/results
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
raw="$(mktemp)"
trap 'rm -f "$raw"' EXIT
torch_env=(LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp MALLOC_MMAP_THRESHOLD_=1073741824
           MALLOC_TRIM_THRESHOLD_=1099511627776)
for round in 1 2; do
  echo "round $round" >&2
  OMP_NUM_THREADS=2 "$bin" --alone | tee -a "$raw"
  OMP_NUM_THREADS=1 "$bin" --alone | tee -a "$raw"
  OMP_NUM_THREADS=2 mpirun --bind-to none -np 1 "$bin" | tee -a "$raw"
  OMP_NUM_THREADS=1 mpirun -np 2 "$bin" | tee -a "$raw"
  OMP_NUM_THREADS=1 mpirun -np 2 "$bin" --shard | tee -a "$raw"
  OMP_NUM_THREADS=1 mpirun -np 2 "$bin" --shard-gradients | tee -a "$raw"
  OMP_NUM_THREADS=1 mpirun -np 2 "$bin" --shard-parameters | tee -a "$raw"
  OMP_NUM_THREADS=1 mpirun -np 2 "$bin" --shard-parameters --no-prefetch | tee -a "$raw"
  OMP_NUM_THREADS=1 mpirun -np 2 "$bin" --shard-parameters --keep | tee -a "$raw"
  OMP_NUM_THREADS=2 mpirun --bind-to none -np 1 "$bin" --shard | tee -a "$raw"
  OMP_NUM_THREADS=2 mpirun --bind-to none -np 1 "$bin" --shard-gradients | tee -a "$raw"
  OMP_NUM_THREADS=2 mpirun --bind-to none -np 1 "$bin" --shard-parameters | tee -a "$raw"
  OMP_NUM_THREADS=1 mpirun -np 2 "$bin" --shard --offload | tee -a "$raw"
  OMP_NUM_THREADS=2 "$bin" --alone --offload | tee -a "$raw"
  OMP_NUM_THREADS=1 mpirun -np 2 "$bin" --policy checkpoint | tee -a "$raw"
  for level in --shard --shard-gradients --shard-parameters; do
    OMP_NUM_THREADS=1 mpirun -np 2 "$bin" --precision bf16 "$level" | tee -a "$raw"
  done
  OMP_NUM_THREADS=2 "$bin" --alone --precision bf16 | tee -a "$raw"
  OMP_NUM_THREADS=2 "$bin" --alone --policy checkpoint | tee -a "$raw"
  for setting in shipped tuned; do
    if [ "$setting" = tuned ]; then e=("${torch_env[@]}"); else e=(); fi
    env "${e[@]}" /usr/bin/python3 bench/ddp_torch.py --ranks 1 | tee -a "$raw"
    env "${e[@]}" /usr/bin/python3 bench/ddp_torch.py --ranks 2 | tee -a "$raw"
  done
done
/usr/bin/python3 - "$raw" "$out" <<'EOF'
import json, sys, datetime, platform, subprocess
raw, out = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(raw) if l.startswith("{")]
with open(out + ".jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
def key(r):
    return (r.get("library", "remat"), r["mode"], r["ranks"], r["threads"], r.get("policy", "stored"),
            r.get("zero", 1 if r.get("shard", False) else 0), r.get("malloc_tuned", None), r.get("offload", False),
            r.get("precision", "fp32"), r.get("prefetch", False), r.get("keep", False))
best = {}
for r in rows:  # the faster of the two rounds
    k = key(r)
    if k not in best or r["step_s"] < best[k]["step_s"]:
        best[k] = r
remat_alone = min(r["step_s"] for k, r in best.items() if k[0] == "remat" and k[1] == "alone" and k[3] == 2 and k[4] == "stored" and not k[7] and k[8] == "fp32")
torch_alone = min(r["step_s"] for k, r in best.items() if k[0] == "torch" and k[1] == "alone")
torch_ddp = min(r["step_s"] for k, r in best.items() if k[0] == "torch" and k[1] == "ddp")
cpu = subprocess.run(["sh", "-c", "lscpu | sed -n 's/^Model name: *//p'"], capture_output=True, text=True).stdout.strip()
lines = [f"<!-- {datetime.date.today()}, {cpu}, 2 cores; bash bench/dist_scaling.sh -->",
         "",
         "| library | run | ranks × threads | policy | optimizer state | step (s) | vs remat alone (2 threads) | vs PyTorch, same run | reduced per step / model gradients | optimizer state per rank |",
         "|---|---|---|---|---|---:|---:|---:|---:|---:|"]
for k, r in sorted(best.items(), key=lambda kv: (kv[0][0] != "remat", kv[0][8], kv[0][1] != "alone", kv[0][2], -kv[0][3], str(kv[0][4]), str(kv[0][5]), str(kv[0][7]), not kv[0][9], kv[0][10])):
    lib, mode, ranks, threads, policy, shard, tuned, offload, precision, prefetch, keep = k
    if lib == "torch":
        run = ("DDP (gloo)" if mode == "ddp" else "alone") + (", OpenMP BLAS + malloc tuned" if tuned else ", as shipped")
        peer = ""
        red = ""
        state = ""
        pol = "plain"
        st = "whole"
    else:
        run = {"alone": "alone", "dist": "remat::dist"}[mode]
        peer_t = torch_alone if (mode == "alone" or ranks == 1) else torch_ddp
        peer = f"{r['step_s'] / peer_t:.2f}×" if policy == "stored" else ""
        red = f"{r['reduced_bytes'] / 2**20:.1f} / {r['model_grad_bytes'] / 2**20:.1f} MiB" if mode == "dist" else "-"
        state = f"{r['optimizer_state_bytes'] / 2**20:.1f} MiB"
        if offload:
            state += f" (+ {r['offloaded_host_bytes'] / 2**20:.1f} MiB host)"
        pol = policy + (", bf16" if precision == "bf16" else "")
        if precision == "bf16":
            peer = ""  # (the PyTorch runs are fp32)
        st = {0: "whole", 1: "sharded (ZeRO-1)", 2: "sharded with the gradients (ZeRO-2)",
              3: "sharded with the gradients and parameters (ZeRO-3)"}[shard] + (
            ", OffloadedAdamW" if offload else "") + (", no prefetch" if shard == 3 and not prefetch else "") + (
            ", kept for backward" if keep else "")
    lines.append(f"| {lib} | {run} | {ranks} × {threads} | {pol} | {st} | {r['step_s']:.3f} | "
                 f"{r['step_s'] / remat_alone:.2f} | {peer} | {red} | {state} |")
lines += ["", f"PyTorch anchors (the faster setting): alone {torch_alone:.3f} s, DDP over gloo {torch_ddp:.3f} s."]
# Per-rank memory by sharding level (rank 0, stored policy, AdamW): the ZeRO paper's table, measured.
mib = lambda b: f"{b / 2**20:.1f}"
lines += ["", "Per-rank memory of the model's state in MiB (rank 0; remat: the optimizer state from its allocator, "
          "parameters and gradients as the memory pages the process holds, read from the kernel, beside the plan's "
          "peak; PyTorch: the tensors' bytes, DDP's gradient buckets not counted):", "",
          "| library | level | ranks | parameters at rest | parameters at the pass's peak (plan) | gradients at rest | "
          "gradients at the pass's peak (plan) | optimizer state | parameters + gradients + state at rest | step (s) |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
mem_rows = []
for k, r in best.items():
    lib, mode, ranks, threads, policy, level, tuned, offload, precision, prefetch, keep = k
    if lib == "remat" and mode == "dist" and policy == "stored" and not offload:
        bf = precision == "bf16"
        params = r.get("param_held_bytes", r["param_bytes"])
        ppeak = f"{mib(r['param_peak_bytes'])} ({mib(r['param_planned_peak_bytes'])})" if level == 3 else mib(params)
        gpeak = f"{mib(r['grad_peak_bytes'])} ({mib(r['grad_planned_peak_bytes'])})" if level >= 2 else mib(r['grad_held_bytes'])
        total = params + r["grad_held_bytes"] + r["optimizer_state_bytes"]
        name = f"ZeRO-{level}" + (", bf16" if bf else "") + (", no prefetch" if level == 3 and not prefetch else "") + (
            ", kept for backward" if keep else "")
        mem_rows.append((0, int(bf), level, ranks, int(prefetch) - 2 * int(keep), f"| remat | {name} | {ranks} | {mib(params)} | {ppeak} | "
                         f"{mib(r['grad_held_bytes'])} | {gpeak} | {mib(r['optimizer_state_bytes'])} | {mib(total)} | "
                         f"{r['step_s']:.3f} |"))
    if lib == "torch" and "param_bytes" in r and tuned:
        total = r["param_bytes"] + r["grad_held_bytes"] + r["optimizer_state_bytes"]
        name = "DDP (gloo)" if mode == "ddp" else "alone"
        mem_rows.append((1, 0, 0, ranks, 0, f"| torch | {name} | {ranks} | {mib(r['param_bytes'])} | {mib(r['param_bytes'])} | "
                         f"{mib(r['grad_held_bytes'])} | {mib(r['grad_held_bytes'])} | {mib(r['optimizer_state_bytes'])} | "
                         f"{mib(total)} | {r['step_s']:.3f} |"))
lines += [row for *_, row in sorted(mem_rows, key=lambda t: t[:5])]
lines += ["", "In bf16 (mixed<bfloat16>) the parameters are the fp32 master weights and their bf16 compute copy "
          "(6 bytes a parameter; ZeRO-3 shards both, and its gather buffer holds bf16)."]
open(out + ".md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
echo "wrote $out.md and $out.jsonl"
