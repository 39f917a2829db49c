#!/usr/bin/env python3
"""Doxygen's input filter for remat's headers, whose comments are plain `//` lines: a header's
first comment block becomes the file's description (and, when it starts with the name of a type
the header declares, "Linear<In, Out, Bias>: ...", that type's too); a comment block on its own
lines documents the declaration after it, and a member's trailing `// ...` documents that member.
`<` and `>` outside backquotes are escaped (`Checkpointed<S>` is not an HTML tag). The headers stay
as they are; only what Doxygen reads changes."""
import re
import sys


def text(t):
    parts = t.split("`")
    for k in range(0, len(parts), 2):  # outside code spans
        parts[k] = parts[k].replace("<", "\\<").replace(">", "\\>")
    return "`".join(parts)


lines = open(sys.argv[1], encoding="utf-8").read().split("\n")
i = 0
head = []
while i < len(lines) and lines[i].startswith("//"):
    head.append(lines[i][2:].strip())
    i += 1
body = lines[i:]

# The type the header's comment starts with, if the header declares it.
named = None
m = re.match(r"^(?:remat::)?(?:[a-z_]+::)*([A-Za-z_][A-Za-z0-9_]*)(?:<[^:]*>)?:", head[0]) if head else None
if m:
    for k, line in enumerate(body):
        if re.match(r"^(struct|class) %s\b[^;]*$" % re.escape(m.group(1)), line):
            at = k - 1 if k > 0 and body[k - 1].startswith("template") else k
            if not (at > 0 and body[at - 1].lstrip().startswith("//")):  # its own comment wins
                named = at
            break

out = []
if head:
    out.append("/** \\file")
    out += [" * " + text(h).replace("*/", "* /") for h in head]
    out.append(" */")
for k, line in enumerate(body):
    if k == named:
        out += ["/// " + text(h) for h in head]
    m = re.match(r"^(\s*)// ?(.*)$", line)
    if m:
        out.append(m.group(1) + "/// " + text(m.group(2)))
        continue
    m = re.match(r"^(\s*[^/\"]*?;)(\s+)// ?(.*)$", line)
    if m and not re.match(r"^\s*(return|if|for|while|else|case|break|continue)\b", line):
        out.append(m.group(1) + m.group(2) + "///< " + text(m.group(3)))
        continue
    out.append(line)
sys.stdout.write("\n".join(out))
