#!/usr/bin/env python3
"""Checks the README and every page of the guide (docs/*.md), so that they cannot drift from the
library: every C++ block compiles (and runs), every link between pages and to files of the
repository resolves (a #fragment to a heading of the page it names), and no page outgrows its
length (README.md 250 lines, a guide page 400).

Each ```cpp block is preceded by an HTML comment that says how to check it (readers do not see it):

  <!-- check: program -->             a whole program: compiled and run (it must exit 0)
  <!-- check: main -->                statements: compiled and run inside int main()
  <!-- check: namespace -->           declarations: compiled at namespace scope
  <!-- check: nvcc -->                a whole program for the GPU: compiled by nvcc when it is here
  <!-- check: mpi -->                 a whole program using remat::dist: compiled and run on one rank

A block (C++, C, Fortran, CMake) may instead be an excerpt of a file that a test compiles and
runs: `<!-- check: excerpt of PATH -->` requires each of its non-blank lines in that file, in
order.

followed, optionally, by lines `before: <C++>` (namespace-scope code placed before the block: the
types and data the surrounding text assumes), `setup: <C++>` (statements run first in main) and
`after: <C++>` (code after the block, in its scope: checks that use what it declares).
Every block gets `#include <remat/remat.hpp>` and `using namespace remat;` first, as the README's
first program has them.

A plain ``` block preceded by `<!-- check: output of TARGET ARGS... -->` is a program's output:
TARGET (a remat example, built in build/default) runs and every line of the block must appear in
its output, in order; a line `varies: REGEX` in the comment marks what may differ between machines
(say so in the prose): text matching it on the page matches that REGEX in the output. A block
without a comment is an error, so a new block cannot slip through unchecked.

  scripts/check_docs.py --build DIR [--jobs N] [PAGE.md ...]   (default: README.md and docs/*.md)
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

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


def check_excerpt(at, path, code):
    """Problems unless every non-blank line of `code` appears in the repository's file `path`, in
    order (leading and trailing blanks aside): a block in C, Fortran or CMake copied from a file a
    test compiles and runs."""
    full = os.path.join(ROOT, path)
    if not os.path.isfile(full):
        return [f"{at}: excerpt of {path}: no such file"]
    lines = [l.strip() for l in open(full, encoding="utf-8").read().split("\n")]
    k = 0
    for want in (l.strip() for l in code.split("\n")):
        if not want:
            continue
        while k < len(lines) and lines[k] != want:
            k += 1
        if k == len(lines):
            return [f"{at}: excerpt of {path}: '{want}' is not in the file (after the lines before it)"]
        k += 1
    return []


MAX_LINES = {"README.md": 250}
GUIDE_MAX_LINES = 400


def slug(heading):
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[|\]\([^)]*\)", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    seen, out, fence = {}, set(), False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            fence = not fence
        m = None if fence else re.match(r"^#{1,6} (.*)$", line.rstrip("\n"))
        if m:
            a = slug(m.group(1))
            n = seen.get(a, 0)
            seen[a] = n + 1
            out.add(a if n == 0 else f"{a}-{n}")
    return out


def check_links(page):
    """Every relative link of a page (outside code) names a file of the repository, and a
    #fragment a heading of the Markdown page it points to. Returns the problems."""
    problems, fence = [], False
    here = os.path.dirname(page)
    for number, line in enumerate(open(page, encoding="utf-8"), 1):
        if line.startswith("```"):
            fence = not fence
        if fence:
            continue
        for target in re.findall(r"\]\(([^)\s]+)\)", re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z]+:", target):
                continue  # a web address: not checked here (CI reaches no network)
            path, _, fragment = target.partition("#")
            full = os.path.normpath(os.path.join(here, path))
            where = f"{os.path.relpath(page, ROOT)}:{number}: link {target}"
            if not path:  # Doxygen's site (scripts/docs.sh) resolves no bare #fragment
                problems.append(f"{where}: name the page too ({os.path.basename(page)}#{fragment})")
            elif not os.path.exists(full):
                problems.append(f"{where}: no such file")
            elif fragment and full.endswith(".md") and fragment not in anchors(full):
                problems.append(f"{where}: no heading with that anchor in {os.path.relpath(full, ROOT)}")
    return problems


def check_length(page):
    rel = os.path.relpath(page, ROOT)
    limit = MAX_LINES.get(rel, GUIDE_MAX_LINES)
    n = sum(1 for _ in open(page, encoding="utf-8"))
    return [f"{rel}: {n} lines, more than {limit}: move a part to a guide page"] if n > limit else []


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
    ap.add_argument("pages", nargs="*", help="Markdown pages (default: README.md and docs/*.md)")
    ap.add_argument("--build", required=True, help="a directory for the generated project")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--examples", default=os.path.join(ROOT, "build", "default", "examples"))
    args = ap.parse_args()
    pages = [os.path.abspath(p) for p in args.pages] or (
        [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))))

    os.makedirs(args.build, exist_ok=True)
    src = os.path.join(args.build, "src")
    shutil.rmtree(src, ignore_errors=True)
    os.makedirs(src)
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)

    targets, outputs, problems = [], [], []
    for page in pages:
        rel = os.path.relpath(page, ROOT)
        problems += check_links(page) + check_length(page)
        stem = re.sub(r"\W", "_", os.path.splitext(rel)[0]).lower()
        for line, lang, directive, code in blocks(page):
            at = f"{rel}:{line}"
            if not directive or not directive[0].startswith("check:"):
                problems.append(f"{at}: a ```{lang} block without a <!-- check: ... --> comment")
                continue
            kind = directive[0][len("check:") :].strip()
            before = [d[len("before:") :].strip() for d in directive[1:] if d.startswith("before:")]
            setup = [d[len("setup:") :].strip() for d in directive[1:] if d.startswith("setup:")]
            after = [d[len("after:") :].strip() for d in directive[1:] if d.startswith("after:")]
            varies = "|".join(d[len("varies:") :].strip() for d in directive[1:] if d.startswith("varies:"))
            if kind.startswith("output of "):
                outputs.append((at, kind[len("output of ") :].split(), code, varies))
                continue
            if kind.startswith("excerpt of "):
                problems += check_excerpt(at, kind[len("excerpt of ") :].strip(), code)
                continue
            if kind not in ("program", "main", "namespace", "nvcc", "mpi"):
                problems.append(f"{at}: unknown check '{kind}'")
                continue
            if kind == "nvcc" and not nvcc:
                print(f"{at}: skipped (no nvcc here)")
                continue
            name = f"{stem}_{line}"
            ext = ".cu" if kind == "nvcc" else ".cpp"
            with open(os.path.join(src, name + ext), "w", encoding="utf-8") as f:
                f.write(f"// {rel}, the block at line {line} ({kind})\n#line 1\n" + wrap(kind, code, before, setup, after))
            targets.append((at, kind, name, ext))
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1

    # One CMake project with an executable per block, against this checkout (add_subdirectory).
    cm = ["cmake_minimum_required(VERSION 3.25)", "project(remat_docs LANGUAGES CXX)"]
    if any(k == "nvcc" for _, k, _, _ in targets):
        cm += ["enable_language(CUDA)", "set(CMAKE_CUDA_ARCHITECTURES 90)"]
    cm += [f'add_subdirectory("{ROOT}" remat)']
    for at, kind, name, ext in targets:
        lib = {"nvcc": "remat::cuda", "mpi": "remat::dist"}.get(kind, "remat::remat")
        cm.append(f"add_executable({name} src/{name}{ext})")
        cm.append(f"target_link_libraries({name} PRIVATE {lib})")
        if kind == "nvcc":
            cm.append(f"target_compile_options({name} PRIVATE -std=c++20)")
        else:  # (-O1: with GCC 12 a block builds faster than at -O0, and its training runs ten times faster)
            cm.append(f"target_compile_options({name} PRIVATE -O1 -Wall -Wextra -Werror -Wno-unused-variable "
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
        at, kind, name, _ = t
        exe = os.path.join(args.build, "build", name)
        if kind == "nvcc" or not os.path.exists(exe):
            return t, None
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
        command = [exe]
        if kind == "mpi":  # two ranks (OpenMPI asks root to confirm)
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
            command = ["mpirun", "-np", "2", exe]
        r = subprocess.run(command, cwd=args.build, capture_output=True, text=True, env=env, timeout=600)
        return t, r

    for (at, kind, name, _), r in map(run, targets):
        if r is None:
            built = os.path.exists(os.path.join(args.build, "build", name))
            print(f"{at}: {kind}: {'compiled' if built or kind == 'nvcc' else 'DID NOT COMPILE'}")
            failed |= not built and kind != "nvcc"
            continue
        print(f"{at}: {kind}: compiled, ran: exit {r.returncode}")
        if r.returncode != 0:
            failed = True
            sys.stdout.write(r.stdout[-4000:] + r.stderr[-4000:])

    for at, command, expected, varies in outputs:
        exe = os.path.join(args.examples, command[0])
        if not os.path.exists(exe):
            print(f"{at}: {exe} is not built", file=sys.stderr)
            failed = True
            continue
        r = subprocess.run([exe] + command[1:], capture_output=True, text=True, timeout=1200,
                           env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2")))
        got = r.stdout.split("\n")
        i, missing = 0, []
        for want in expected.split("\n"):
            if not want.strip():
                continue
            pat = re.compile(line_pattern(want.rstrip(), varies))
            while i < len(got) and not pat.match(got[i].rstrip()):
                i += 1
            if i == len(got):
                missing.append(want)
                i = 0
            else:
                i += 1
        if missing or r.returncode != 0:
            failed = True
            print(f"{at}: the output of {' '.join(command)} (exit {r.returncode}) lacks, in order:",
                  *missing, "it printed:", r.stdout, sep="\n")
        else:
            print(f"{at}: output of {' '.join(command)}: every line as the page shows it")
    print(f"{len(pages)} pages: every link resolves, every length within its limit; "
          f"{len(targets)} C++ blocks, {len(outputs)} program outputs checked")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
