#!/usr/bin/env python3
"""Compiles (and runs) every C++ block of README.md, so the README cannot drift from the library.

Each ```cpp block is preceded by an HTML comment that says how to check it (readers do not see it):

  <!-- check: program -->             a whole program: compiled and run (it must exit 0)
  <!-- check: main -->                statements: compiled and run inside int main()
  <!-- check: namespace -->           declarations: compiled at namespace scope
  <!-- check: nvcc -->                a whole program for the GPU: compiled by nvcc when it is here
  <!-- check: mpi -->                 a whole program using remat::dist: compiled and run on one rank

followed, optionally, by lines `before: <C++>` (namespace-scope code placed before the block: the
types and data the surrounding text assumes), `setup: <C++>` (statements run first in main) and
`after: <C++>` (code after the block, in its scope: checks that use what it declares).
Every block gets `#include <remat/remat.hpp>` and `using namespace remat;` first, as the README's
first example has them.

A plain ``` block preceded by `<!-- check: output of TARGET ARGS... -->` is a program's output:
TARGET (a remat example, built in build/default) runs and every line of the block must appear in
its output, in order; a line `varies: REGEX` in the comment marks what may differ between machines
(say so in the prose): text matching it in the README matches that REGEX in the output. A block without a comment is an error, so a new block cannot slip through unchecked.

  scripts/readme_blocks.py --build DIR [--readme README.md] [--jobs N] [--keep-going]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def blocks(readme):
    """(line, kind, directive lines, language, code) of every fenced block with a check comment."""
    lines = open(readme, encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        lang, start = m.group(1), i
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        code = "\n".join(lines[i + 1 : j])
        # The comment right before the block (its lines, which may span several).
        k = start - 1
        directive = []
        if k >= 0 and lines[k].rstrip().endswith("-->"):
            end = k
            while k >= 0 and "<!--" not in lines[k]:
                k -= 1
            text = "\n".join(lines[k : end + 1])
            text = text[text.index("<!--") + 4 : text.rindex("-->")].strip()
            directive = [t.strip() for t in text.split("\n") if t.strip()]
        if lang == "cpp" or (directive and directive[0].startswith("check:")):
            out.append((start + 1, lang, directive, code))
        i = j + 1
    return out


def wrap(kind, code, before, setup, after):
    head = "#include <remat/remat.hpp>\nusing namespace remat;\n"
    if kind in ("program", "nvcc", "mpi"):  # the block's own includes; `before` after its using-directive
        lines = code.split("\n")
        at = next((i + 1 for i, l in enumerate(lines) if l.strip() == "using namespace remat;"), 0)
        if at == 0:
            lines = head.rstrip("\n").split("\n") + lines
            at = 2
        return "\n".join(lines[:at] + before + lines[at:]) + "\n"
    if kind == "namespace":
        return head + "\n".join(before) + "\n" + code + "\n" + "\n".join(after) + "\nint main() {}\n"
    if kind == "main":
        return head + "\n".join(before) + "\nint main() {\n" + "\n".join(setup) + "\n" + code + "\n" + "\n".join(after) + "\n}\n"
    raise ValueError(kind)


def line_pattern(line, varies):
    if not varies:
        return "^" + re.escape(line) + "$"
    out, at = [], 0
    for m in re.finditer(varies, line):
        out += [re.escape(line[at : m.start()]), "(?:" + varies + ")"]
        at = m.end()
    return "^" + "".join(out) + re.escape(line[at:]) + "$"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    ap.add_argument("--build", required=True, help="a directory for the generated project")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--examples", default=os.path.join(ROOT, "build", "default", "examples"))
    args = ap.parse_args()

    found = blocks(args.readme)
    os.makedirs(args.build, exist_ok=True)
    src = os.path.join(args.build, "src")
    shutil.rmtree(src, ignore_errors=True)
    os.makedirs(src)
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)

    targets, outputs, problems = [], [], []
    for line, lang, directive, code in found:
        if not directive or not directive[0].startswith("check:"):
            problems.append(f"README.md:{line}: a ```{lang} block without a <!-- check: ... --> comment")
            continue
        kind = directive[0][len("check:") :].strip()
        before = [d[len("before:") :].strip() for d in directive[1:] if d.startswith("before:")]
        setup = [d[len("setup:") :].strip() for d in directive[1:] if d.startswith("setup:")]
        after = [d[len("after:") :].strip() for d in directive[1:] if d.startswith("after:")]
        varies = "|".join(d[len("varies:") :].strip() for d in directive[1:] if d.startswith("varies:"))
        if kind.startswith("output of "):
            outputs.append((line, kind[len("output of ") :].split(), code, varies))
            continue
        if kind not in ("program", "main", "namespace", "nvcc", "mpi"):
            problems.append(f"README.md:{line}: unknown check '{kind}'")
            continue
        if kind == "nvcc" and not nvcc:
            print(f"README.md:{line}: skipped (no nvcc here)")
            continue
        name = f"readme_{line}"
        ext = ".cu" if kind == "nvcc" else ".cpp"
        with open(os.path.join(src, name + ext), "w", encoding="utf-8") as f:
            f.write(f"// README.md, the block at line {line} ({kind})\n#line 1\n" + wrap(kind, code, before, setup, after))
        targets.append((line, kind, name, ext))
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1

    # One CMake project with an executable per block, against this checkout (add_subdirectory).
    cm = ["cmake_minimum_required(VERSION 3.25)", "project(remat_readme LANGUAGES CXX)"]
    if any(k == "nvcc" for _, k, _, _ in targets):
        cm += ["enable_language(CUDA)", "set(CMAKE_CUDA_ARCHITECTURES 90)"]
    cm += [f'add_subdirectory("{ROOT}" remat)']
    for line, kind, name, ext in targets:
        lib = {"nvcc": "remat::cuda", "mpi": "remat::dist"}.get(kind, "remat::remat")
        cm.append(f"add_executable({name} src/{name}{ext})")
        cm.append(f"target_link_libraries({name} PRIVATE {lib})")
        if kind == "nvcc":
            cm.append(f"target_compile_options({name} PRIVATE -std=c++20)")
        else:  # (the blocks' training runs are short: unoptimised, they build fastest)
            cm.append(f"target_compile_options({name} PRIVATE -O0 -Wall -Wextra -Werror -Wno-unused-variable "
                      "-Wno-unused-but-set-variable)")
    with open(os.path.join(args.build, "CMakeLists.txt"), "w") as f:
        f.write("\n".join(cm) + "\n")
    cfg = ["cmake", "-S", args.build, "-B", os.path.join(args.build, "build"), "-DCMAKE_BUILD_TYPE=Release"]
    if nvcc:
        cfg.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
    subprocess.run(cfg, check=True, stdout=subprocess.DEVNULL)
    build = subprocess.run(["cmake", "--build", os.path.join(args.build, "build"), f"-j{args.jobs}", "--", "-k"])
    failed = build.returncode != 0

    def run(t):
        line, kind, name, _ = t
        exe = os.path.join(args.build, "build", name)
        if kind == "nvcc" or not os.path.exists(exe):
            return line, kind, None
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
        command = [exe]
        if kind == "mpi":  # two ranks (OpenMPI asks root to confirm)
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
            command = ["mpirun", "-np", "2", exe]
        r = subprocess.run(command, cwd=args.build, capture_output=True, text=True, env=env, timeout=600)
        return line, kind, r

    for line, kind, r in map(run, targets):
        if r is None:
            built = os.path.exists(os.path.join(args.build, "build", f"readme_{line}"))
            print(f"README.md:{line}: {kind}: {'compiled' if built or kind == 'nvcc' else 'DID NOT COMPILE'}")
            failed |= not built and kind != "nvcc"
            continue
        ok = r.returncode == 0
        print(f"README.md:{line}: {kind}: compiled, ran: exit {r.returncode}")
        if not ok:
            failed = True
            sys.stdout.write(r.stdout[-4000:] + r.stderr[-4000:])

    for line, command, expected, varies in outputs:
        exe = os.path.join(args.examples, command[0])
        if not os.path.exists(exe):
            print(f"README.md:{line}: {exe} is not built", file=sys.stderr)
            failed = True
            continue
        r = subprocess.run([exe] + command[1:], capture_output=True, text=True, timeout=1200,
                           env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2")))
        got = r.stdout.split("\n")
        at, missing = 0, []
        for want in expected.split("\n"):
            if not want.strip():
                continue
            pat = re.compile(line_pattern(want.rstrip(), varies))
            while at < len(got) and not pat.match(got[at].rstrip()):
                at += 1
            if at == len(got):
                missing.append(want)
                at = 0
            else:
                at += 1
        if missing or r.returncode != 0:
            failed = True
            print(f"README.md:{line}: the output of {' '.join(command)} (exit {r.returncode}) lacks, in order:",
                  *missing, "it printed:", r.stdout, sep="\n")
        else:
            print(f"README.md:{line}: output of {' '.join(command)}: every line as the README shows it")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
