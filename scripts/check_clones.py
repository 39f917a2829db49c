#!/usr/bin/env python3
"""Finds per-element work that a program's AVX2/AVX-512 loops call out of line.

remat's host loops are compiled three times (REMAT_HOST_CLONES: the baseline, x86-64-v3 and
x86-64-v4), and the version for the processor runs. A function such a loop calls without inlining
it is compiled once, for the baseline: called per element or per row, it keeps the loop scalar
(SSE2, no FMA), whatever the processor. remat forces its per-element functions inline
(REMAT_HOST_DEVICE, REMAT_LAMBDA, REMAT_HOST_LAMBDA); this check finds where that was missed.

It disassembles each program (objdump) and reports every call from a clone (a function whose
name ends in .arch_x86_64_v3 or .arch_x86_64_v4) to a remat function that calls nothing of the
program's own (a leaf: its work is the caller's loop body; calls through the PLT, to libc or libm,
do not count). A layer's per-head work (a lambda that runs products) is not a leaf and is left
alone: its own loops have clones of their own.

Usage: check_clones.py PROGRAM [PROGRAM ...]   (exit status 1 when some call is found)
"""
import re
import subprocess
import sys

FUNCTION = re.compile(r"^[0-9a-f]+ <(.+)>:$")
CALL = re.compile(r"\bcall\s+[0-9a-f]+ <([^>+]+)>")
CLONE = re.compile(r"\.arch_x86_64_v[34]$")


def calls_of(program):
    """Each function's name -> the set of functions it calls (mangled names, PLT stubs left out)."""
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", program], capture_output=True, text=True,
                          check=True).stdout
    calls, current = {}, None
    for line in text.splitlines():
        m = FUNCTION.match(line)
        if m:
            current = m.group(1)
            calls.setdefault(current, set())
            continue
        m = CALL.search(line)
        if current and m and "@plt" not in m.group(1):
            calls[current].add(m.group(1))
    return calls


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.splitlines()))


def main(programs):
    found = 0
    for program in programs:
        calls = calls_of(program)
        out_of_line = {}  # callee -> a clone that calls it
        for caller, callees in calls.items():
            if not CLONE.search(caller):
                continue
            for callee in callees:
                if CLONE.search(callee) or callee.endswith(".resolver") or calls.get(callee):
                    continue  # (another clone, an ifunc resolver, or a function that calls others)
                if callee in calls:  # (the program's own, a leaf)
                    out_of_line.setdefault(callee, caller)
        names = demangle(sorted(set(out_of_line) | set(out_of_line.values())))
        for callee, caller in sorted(out_of_line.items()):
            if "remat::" not in names[callee].split("(")[0]:  # (after a return type, if any: "auto remat::...")
                continue
            found += 1
            print(f"{program}: {names[callee][:300]}\n    called out of line from {names[caller][:300]}\n")
    if found:
        print(f"{found} remat function(s) called out of line from AVX2/AVX-512 loops: mark them REMAT_HOST_DEVICE "
              "(functions) or REMAT_LAMBDA / REMAT_HOST_LAMBDA (lambdas)", file=sys.stderr)
        return 1
    print(f"no remat function called out of line from an AVX2/AVX-512 loop in {len(programs)} program(s)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1:]))
