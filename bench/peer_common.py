"""What the scripts that run remat beside PyTorch share (bench/compare_*.py): glibc's raised malloc
thresholds, the heap in use, the BLAS PyTorch mapped, a child's JSON line, the medians of a row's
rounds, the processor's name and the results' files."""
import ctypes
import datetime
import json
import os
import platform
import statistics
import subprocess

# glibc's thresholds raised so that freed blocks stay in the heap (one of the peer's settings).
MALLOC_TUNED = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


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
            # (not cuBLAS, and not numpy's own OpenBLAS, which PyTorch does not call)
            if ("blas" in base or "mkl" in base) and "cublas" not in base and "scipy_openblas" not in base:
                names.add(os.path.realpath(path))
    return sorted(names)


def run_child(cmd, env):
    """The last JSON line a program prints, run on 2 OpenMP threads with `env` added."""
    e = dict(os.environ, OMP_NUM_THREADS="2")
    e.update(env)
    out = subprocess.run(cmd, env=e, check=True, capture_output=True, text=True).stdout
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
