#!/usr/bin/env python3
"""Fails on any include under include/remat/ that points up the library's folder order.

The order (docs/architecture.md): a header may include headers of its own folder and of the folders
before it, never of one after it. Top-level headers (config.hpp, error.hpp, device.hpp) come first;
remat.hpp, the umbrella, may include anything; the deprecated forwarding headers under dist/ may
include what they forward to.
"""
import os
import re
import sys

ORDER = ["", "numeric", "cuda", "memory", "tensor", "expr", "kernels", "pass", "layers", "graph",
         "plan", "policy", "models", "train", "runtime", "io", "parallel", "capi"]
EXEMPT = {"remat.hpp"}
FORWARDING = "dist"  # folder of one-line deprecated forwarding headers (remat 0.x: dist/ → parallel/)

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "include", "remat")
root = os.path.normpath(root)
include = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def folder(path):
    rel = os.path.relpath(path, root)
    top = rel.split(os.sep)[0]
    return "" if top == rel else top


failures = []
for dirpath, _, files in os.walk(root):
    for name in sorted(files):
        if not name.endswith((".hpp", ".cuh", ".h")):
            continue
        path = os.path.join(dirpath, name)
        rel = os.path.relpath(path, root)
        if rel in EXEMPT:
            continue
        mine = folder(path)
        if mine == FORWARDING:
            continue
        if mine not in ORDER:
            failures.append(f"{rel}: folder '{mine}' is not in the order of docs/architecture.md")
            continue
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                m = include.match(line)
                if not m:
                    continue
                kind, target = m.groups()
                if kind == '"':
                    resolved = os.path.normpath(os.path.join(dirpath, target))
                elif target.startswith("remat/"):
                    resolved = os.path.normpath(os.path.join(root, target[len("remat/"):]))
                else:
                    continue
                if not resolved.startswith(root + os.sep):
                    failures.append(f"{rel}:{lineno}: includes {target}, outside include/remat")
                    continue
                theirs = folder(resolved)
                if theirs == FORWARDING:
                    failures.append(f"{rel}:{lineno}: includes the deprecated {target}")
                    continue
                if theirs not in ORDER:
                    failures.append(f"{rel}:{lineno}: includes {target}, folder '{theirs}' not in the order")
                    continue
                if ORDER.index(theirs) > ORDER.index(mine):
                    failures.append(f"{rel}:{lineno}: {mine or 'top level'}/ includes {target}, "
                                    f"which is in {theirs}/, later in the order")

order = " → ".join(o or "config/error/device" for o in ORDER)
if failures:
    print("include order broken (the order: " + order + "):")
    for f in failures:
        print("  " + f)
    sys.exit(1)
print("include order kept: " + order)
