"""What the scripts that run remat beside PyTorch share (bench/compare_*.py): which PyTorch is the
peer and the ways it is run, glibc's raised malloc thresholds, the heap in use, the BLAS PyTorch
mapped, the peer's fastest AdamW, its timed steps, a child's JSON line, the medians of a row's
rounds, the processor's name and ceiling, and the results' files."""
import ctypes
import datetime
import json
import os
import platform
import statistics
import subprocess

# glibc's thresholds raised so that freed blocks stay in the heap (one of the peer's settings).
MALLOC_TUNED = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
# (name, environment, torch.compile) of each way today's PyTorch is run; the fastest is the peer.
TORCH_SETTINGS = [("eager", {}, False), ("eager, malloc tuned", MALLOC_TUNED, False),
                  ("compile", {}, True), ("compile, malloc tuned", MALLOC_TUNED, True)]
DEBIAN_PYTHON = "/usr/bin/python3"  # Debian's python3-torch (1.13): the tests' cross-check, one more row
# Today's PyTorch from PyPI, pinned (scripts/setup.sh bench).
VENV_PYTHON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".venv-bench", "bin", "python")


def todays_python(override=None):
    """The interpreter of today's PyTorch: `override`, else .venv-bench's, else this one."""
    import sys
    return override or (VENV_PYTHON if os.path.exists(VENV_PYTHON) else sys.executable)


def add_peer_options(ap):
    """The options that pick the peers: --torch-python (today's PyTorch's interpreter) and
    --no-debian (leave out the row of Debian's 1.13)."""
    ap.add_argument("--torch-python", default=None,
                    help="the interpreter of today's PyTorch (default: .venv-bench/bin/python from "
                         "scripts/setup.sh bench)")
    ap.add_argument("--no-debian", action="store_true", help="leave out the row of Debian's PyTorch 1.13")


def chosen_peers(args):
    """(today's PyTorch's interpreter, whether Debian's 1.13 runs as one more row) from the options
    of add_peer_options: the row runs where Debian's interpreter exists and is not the anchor."""
    python = todays_python(args.torch_python)
    debian = not args.no_debian and os.path.exists(DEBIAN_PYTHON) and \
        os.path.abspath(python) != os.path.abspath(DEBIAN_PYTHON)
    return python, debian


def run_peer(python, cmd, chosen, key):
    """PyTorch's child `cmd` (its arguments after the interpreter) run each way of TORCH_SETTINGS,
    or, once `chosen[key]` names the fastest (the first round's), that way alone. A way
    torch.compile cannot take (PyTorch 1.13 has none) is left out, and said so. Returns the
    fastest way's line, with "way" and "ways" (every way's step_s) added."""
    runs = []
    for name, env, comp in [w for w in TORCH_SETTINGS if chosen.get(key, w[0]) == w[0]]:
        try:
            runs.append(dict(run_child([python] + cmd + (["--compile"] if comp else []), env), way=name))
        except subprocess.CalledProcessError as e:
            if not comp:
                raise
            print(f"    ({name} left out: {(e.stderr or '').strip().splitlines()[-1:]})", flush=True)
    best = min(runs, key=lambda r: r["step_s"])
    chosen[key] = best["way"]
    return dict(best, ways={r["way"]: r["step_s"] for r in runs})


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def heap_in_use():
    """Bytes glibc's heap holds for this process now (mallinfo2: in use plus mapped blocks)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _Mallinfo2
    m = libc.mallinfo2()
    return m.uordblks + m.hblkhd


def loaded_blas():
    """The host BLAS libraries mapped into this process (none where PyTorch links MKL statically)."""
    names = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1] if "/" in line else ""
            base = os.path.basename(path)
            # (not cuBLAS, not numpy's own OpenBLAS, which PyTorch does not call, and not a
            # torch.compile kernel whose hashed name happens to hold "mkl")
            if ("blas" in base or "mkl" in base) and "cublas" not in base and "scipy_openblas" not in base \
                    and "torchinductor" not in path:
                names.add(os.path.realpath(path))
    return sorted(names)


def timed_steps(step, warmup, steps):
    """Runs step() `warmup` times untimed, then `steps` times: (the median seconds, the last loss)."""
    import time
    for _ in range(warmup):
        step()
    times, loss = [], None
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), loss


def fastest_adamw(torch, params, lr):
    """PyTorch's AdamW at its fastest: `fused=True` (one kernel over all the parameters), which
    PyTorch 2.4 and later also run on the CPU, where it took 9.1-13.9 ms for 32 million parameters
    against 35-68 ms for the default for-each-tensor loop and 77 ms for `foreach=True` (2.15 on a
    2-core Zen 5); the default where fused is not there (Debian's 1.13 fuses on CUDA only). Which
    one it is: `opt.defaults.get("fused")`."""
    params = list(params)
    try:
        return torch.optim.AdamW(params, lr=lr, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(params, lr=lr)


def run_child(cmd, env):
    """The last JSON line a program prints, run on 2 OpenMP threads with `env` added."""
    e = dict(os.environ, OMP_NUM_THREADS="2")
    e.update(env)
    try:
        out = subprocess.run(cmd, env=e, check=True, capture_output=True, text=True).stdout
    except subprocess.CalledProcessError as err:
        if "--compile" not in cmd:
            print(err.stderr, flush=True)
        raise
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def median_row(results):
    """{setting: [a line per round]} -> {setting: the first round's line with the median step_s}."""
    row = {}
    for setting, rounds in results.items():
        r = dict(rounds[0])
        r["step_s"] = statistics.median(x["step_s"] for x in rounds)
        r["setting"] = setting
        row[setting] = r
    return row


def cpu_name():
    """The processor's model name (/proc/cpuinfo)."""
    try:
        return next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (StopIteration, OSError):
        return platform.processor() or "cpu"


def processor_ceiling(program, precision):
    """The processor's multiply-add ceiling for `precision` ("bf16": vdpbf16ps; else the widest fp32
    FMA) from bench_peak beside `program` (the same build's bench/ folder), a short run: a dict of
    its JSON line (gflops_1_thread, threads, gflops_all_threads), or None where bench_peak is not
    built or the processor lacks those instructions. A ratio of all threads to one well under the
    thread count says that other work held a core while it ran."""
    exe = os.path.join(os.path.dirname(os.path.abspath(program)), "bench_peak")
    if not os.path.exists(exe):
        return None
    out = subprocess.run([exe, "0.2", "3"], capture_output=True, text=True).stdout
    rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    if precision == "bf16":
        rows = [r for r in rows if r["kernel"].startswith("vdpbf16ps")]
    else:
        rows = [r for r in rows if r["kernel"].startswith("vfmadd231ps")]
    return max(rows, key=lambda r: r["gflops_all_threads"]) if rows else None


def ceiling_text(c):
    """One line of processor_ceiling's result."""
    if c is None:
        return "not measured (bench_peak not built, or not this processor's instructions)"
    ratio = c["gflops_all_threads"] / c["gflops_1_thread"]
    return (f"{c['kernel']} {c['gflops_all_threads']:.0f} GFLOP/s on {c['threads']} threads, {ratio:.2f}x one thread"
            + (" (other work held a core: this hour's timings mean little)" if ratio < 0.8 * c["threads"] else ""))


def today():
    return datetime.date.today().isoformat()


def write_results(out, lines, md):
    """OUT.jsonl (a line each) and OUT.md (the table), which is printed too."""
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out + ".jsonl", "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    with open(out + ".md", "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
