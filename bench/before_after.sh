#!/usr/bin/env bash
# Whether a change moved remat's speed: two builds' bench_policies and bench_dist, run in
# interleaved rounds (before, after, before, after, ...: these machines are shared and noisy), and
# for each configuration the median step time of each build and their ratio (after / before). Prints
# a table and JSON lines; tests never assert on timings, this is for a change's note. The
# processor's ceiling (bench_peak) before and after the rounds says whether the machine was shared.
#
#   bash bench/before_after.sh BEFORE_BENCH_DIR AFTER_BENCH_DIR [ROUNDS] [SET]
#
# (BENCH_DIR: a build's bench/ folder, holding bench_policies and bench_dist; ROUNDS: 5 unless
# given.) bench_dist runs under mpirun -np 2 when mpirun is here. SET "large" runs issue 49's larger
# configurations instead (MLP batch 256 and 2048 x 16 blocks, GPT 16 x 4, fp32 and bf16, stored and
# checkpoint), without bench_dist; SET "small" the batch-256 MLP (bf16 16 and 8 blocks, fp32 8,
# stored; bf16 16 blocks checkpointed) with 20 or 30 steps each, where what a step costs beyond its
# layers shows (zeroing, the optimizer), and the GPT 16 x 4 bf16 stored; SET "gpt" the GPT 16 x 4
# alone, fp32 and bf16, stored, checkpoint and selective; SET "dropout" the same GPT with dropout
# 0.1, stored and checkpointed (stored_dropout, checkpoint_dropout); SET "examples" the wall time
# of whole runs of the examples beside the bench folder (BENCH_DIR/../examples: charlm
# checkpointed, 40 steps, fp32 and bf16; digits, 5 epochs, fp32 and half), whose loops are compiled
# apart from the benchmarks'.
set -euo pipefail
before="$1"
after="$2"
rounds="${3:-5}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
raw="$(mktemp)"
trap 'rm -f "$raw"' EXIT

# name | command (BIN is replaced by the build's bench folder)
configs=(
  "mlp fp32 b256 stored|BIN/bench_policies --workload mlp --batch 256 --blocks 8 --policy stored --steps 6 --warmup 2"
  "mlp fp32 b256 checkpoint|BIN/bench_policies --workload mlp --batch 256 --blocks 8 --policy checkpoint --steps 6 --warmup 2"
  "mlp fp32 b256 selective|BIN/bench_policies --workload mlp --batch 256 --blocks 8 --policy selective --steps 6 --warmup 2"
  "mlp bf16 b256 checkpoint|BIN/bench_policies --workload mlp --batch 256 --blocks 8 --policy checkpoint --precision bf16 --steps 6 --warmup 2"
  "gpt fp32 b16 checkpoint|BIN/bench_policies --workload gpt --batch 16 --blocks 4 --policy checkpoint --steps 4 --warmup 1"
)
if [ "${4:-}" = large ]; then
  configs=()
  for p in fp32 bf16; do
    for pol in stored checkpoint; do
      configs+=("mlp $p b256x16 $pol|BIN/bench_policies --workload mlp --batch 256 --blocks 16 --policy $pol --precision $p --steps 5 --warmup 2"
                "mlp $p b2048x16 $pol|BIN/bench_policies --workload mlp --batch 2048 --blocks 16 --policy $pol --precision $p --steps 3 --warmup 1"
                "gpt $p b16x4 $pol|BIN/bench_policies --workload gpt --batch 16 --blocks 4 --policy $pol --precision $p --steps 3 --warmup 1")
    done
  done
elif [ "${4:-}" = small ]; then
  configs=()
  for c in "bf16 16 20" "bf16 8 30" "fp32 8 20"; do
    read -r p b n <<<"$c"
    configs+=("mlp $p b256x$b stored|BIN/bench_policies --workload mlp --batch 256 --blocks $b --policy stored --precision $p \
--steps $n --warmup 3")
  done
  configs+=("mlp bf16 b256x16 checkpoint|BIN/bench_policies --workload mlp --batch 256 --blocks 16 --policy checkpoint \
--precision bf16 --steps 20 --warmup 3"
            "gpt bf16 b16x4 stored|BIN/bench_policies --workload gpt --batch 16 --blocks 4 --policy stored --precision bf16 \
--steps 4 --warmup 1")
elif [ "${4:-}" = gpt ]; then
  configs=()
  for p in fp32 bf16; do
    for pol in stored checkpoint selective; do
      configs+=("gpt $p b16x4 $pol|BIN/bench_policies --workload gpt --batch 16 --blocks 4 --policy $pol --precision $p \
--steps 3 --warmup 1")
    done
  done
elif [ "${4:-}" = dropout ]; then
  # (both builds need bench_policies' stored_dropout and checkpoint_dropout: main from 2026-12-07 on)
  configs=()
  for p in fp32 bf16; do
    for pol in stored_dropout checkpoint_dropout; do
      configs+=("gpt $p b16x4 $pol|BIN/bench_policies --workload gpt --batch 16 --blocks 4 --policy $pol --precision $p \
--steps 3 --warmup 1")
    done
  done
elif [ "${4:-}" = examples ]; then
  # wall COMMAND...: runs it and prints its wall time as a result line
  wall() {
    local t0="$EPOCHREALTIME"
    "$@" >/dev/null
    awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "{\"step_s\": %.4f}\n", b - a }'
  }
  export -f wall
  configs=()
  for p in fp32 bf16; do
    configs+=("charlm $p checkpoint, 40 steps (run s)|OMP_WAIT_POLICY=PASSIVE wall BIN/../examples/charlm --steps 40 \
--batch 16 --checkpoint --sample 0 --precision $p")
  done
  for p in fp32 half; do
    configs+=("digits $p, 5 epochs (run s)|OMP_WAIT_POLICY=PASSIVE wall BIN/../examples/digits --epochs 5 --precision $p")
  done
elif command -v mpirun >/dev/null; then
  configs+=(
    "dist 2 ranks|OMP_NUM_THREADS=1 mpirun -np 2 BIN/bench_dist"
    "dist 2 ranks ZeRO-3|OMP_NUM_THREADS=1 mpirun -np 2 BIN/bench_dist --shard-parameters"
  )
fi

# The processor's own ceiling before the rounds and after them (bench_peak, where the after build
# has it): all threads well under their count times one means another tenant held a core.
ceiling() {
  if [ -x "$after/bench_peak" ]; then
    echo "the processor's ceiling $1 the rounds (bench_peak):"
    "$after/bench_peak" 0.2 3 | grep '^|'
    echo
  fi
}
ceiling before

for ((r = 1; r <= rounds; r++)); do
  echo "round $r of $rounds" >&2
  for c in "${configs[@]}"; do
    name="${c%%|*}"
    cmd="${c#*|}"
    for side in before after; do
      dir="$before"
      [ "$side" = after ] && dir="$after"
      line="$(bash -c "${cmd//BIN/$dir}" 2>/dev/null | grep '^{' | tail -1)"
      printf '%s\t%s\t%s\n' "$name" "$side" "$line" >>"$raw"
    done
  done
done

ceiling after

python3 - "$raw" <<'EOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, side, js = line.rstrip("\n").split("\t", 2)
    if not js:
        continue
    d = json.loads(js)
    t = d.get("step_s") or d.get("step_seconds") or d.get("seconds_per_step")
    if t is None:
        continue
    rows.setdefault(name, {"before": [], "after": []})[side].append(float(t))
print(f"| configuration | before (median s a step, or a run) | after | after / before |")
print("|---|---|---|---|")
out = []
for name, v in rows.items():
    if not v["before"] or not v["after"]:
        continue
    b, a = statistics.median(v["before"]), statistics.median(v["after"])
    print(f"| {name} | {b:.4f} | {a:.4f} | {a / b:.3f} |")
    out.append({"configuration": name, "before_s": b, "after_s": a, "ratio": a / b, "rounds": len(v["after"])})
for o in out:
    print(json.dumps(o))
EOF
