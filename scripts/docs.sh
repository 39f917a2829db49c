#!/usr/bin/env bash
# The API reference: Doxygen over the public headers and docs/guarantees.md, into
# build/docs/html/index.html (scripts/setup.sh docs installs Doxygen).
#
# Every warning must be known: docs/undocumented.txt lists the public names not documented yet
# (one line each, without line numbers); a warning not in it (a new public name without a comment,
# a broken reference) fails this script. Document a name and its line leaves the list:
#   scripts/docs.sh --update   rewrites docs/undocumented.txt from this run
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh docs
mkdir -p build/docs
doxygen docs/Doxyfile
# "include/remat/x.hpp:12: warning: ..." -> "remat/x.hpp: warning: ..." (paths from the root, no line)
sed -E "s|^$(pwd)/||; s|^include/||; s|^([^:]+):[0-9]+: |\1: |" build/docs/warnings.log | sort -u > build/docs/warnings.txt
if [ "${1:-}" = "--update" ]; then
  cp build/docs/warnings.txt docs/undocumented.txt
fi
new="$(comm -23 build/docs/warnings.txt <(sort -u docs/undocumented.txt))"
known="$(wc -l < docs/undocumented.txt)"
now="$(wc -l < build/docs/warnings.txt)"
echo "API reference: build/docs/html/index.html; $now warnings, $known listed in docs/undocumented.txt"
if [ -n "$new" ]; then
  echo "warnings not in docs/undocumented.txt (document these names, or fix the comments):" >&2
  printf '%s\n' "$new" >&2
  exit 1
fi
