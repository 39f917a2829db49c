#!/usr/bin/env python3
"""Doxygen's input filter for remat's headers, whose comments are plain `//` lines: a header's
first comment block becomes the file's description (and, when it starts with the name of a type
the header declares, "Linear<In, Out, Bias>: ...", that type's too); a comment block on its own
lines documents the declaration after it, and a member's trailing `// ...` documents that member
(a data member, or a function defined on its one line).
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

# A comment block over overloads of one name (`parameters()` and `parameters() const`, one after
# the other without a blank line) documents them all: they become a member group, whose
# documentation Doxygen gives every member (DISTRIBUTE_GROUP_DOC).
def declared_name(line):
    m = re.match(r"^(?:template\s*<.*>\s*)?(?:[\w:<>,\s\*&]*?\s)?[\*&]*(~?\w+|operator\S+)\s*\(", line.strip())
    return m.group(1) if m else None


group_open, group_close = set(), set()
k = 0
while k < len(body):
    m = re.match(r"^(\s*)//", body[k])
    if not m:
        k += 1
        continue
    indent, start = m.group(1), k
    while k < len(body) and re.match(r"^%s//" % re.escape(indent), body[k]):
        k += 1
    name, members, end = None, 0, k
    while end < len(body) and body[end].strip():
        line = body[end]
        lead = line[: len(line) - len(line.lstrip())]
        if len(lead) < len(indent) or (lead == indent and line.lstrip().startswith("//")):
            break
        if lead == indent and not re.match(r"^[})\]{]|^(public|private|protected):|^#|^template\b", line.lstrip()):
            this = declared_name(line)
            if this is None or (name is not None and this != name):
                break
            name = this
            members += 1
        end += 1
    if members >= 2:
        while end > k and (body[end - 1].lstrip().startswith("template") or not body[end - 1].strip()):
            end -= 1  # (a template line belongs to the next declaration)
        group_open.add(k)  # (after the comment, which becomes the group's)
        group_close.add(end)
    k = max(k, start + 1)

out = []
if head:
    out.append("/** \\file")
    out += [" * " + text(h).replace("*/", "* /") for h in head]
    out.append(" */")
for k, line in enumerate(body):
    if k in group_close:
        out.append("///@}")
    if k in group_open:
        out.append("///@{")
    if k == named:
        out += ["/// " + text(h) for h in head]
    m = re.match(r"^(\s*)// ?(.*)$", line)
    if m:
        out.append(m.group(1) + "/// " + text(m.group(2)))
        continue
    # (code without strings or comments: a `/` is a division unless another `/` or a `*` follows)
    c = r"""(?:[^/"]|/(?![/*]))"""
    m = re.match(r"^(\s*%s*?;)(\s+)// ?(.*)$" % c, line) or re.match(
        r"^(\s*%s*\(%s*\)%s*\{%s*\})(\s+)// ?(.*)$" % (c, c, c, c), line)  # (a one-line function)
    if m and not re.match(r"^\s*(return|if|for|while|else|case|break|continue)\b", line):
        out.append(m.group(1) + m.group(2) + "///< " + text(m.group(3)))
        continue
    out.append(line)
if len(body) in group_close:
    out.append("///@}")
sys.stdout.write("\n".join(out))
