#!/usr/bin/env bash
# oneDNN 3.x on a system whose own is 2.x (Debian 12 ships 2.6): fetches Intel's CPU build of
# oneDNN 3.2.0 with GCC's OpenMP runtime (the PyPI wheels onednn-cpu-gomp and onednn-devel-cpu-gomp,
# 2023.2.0; pinned by their SHA-256) into DIR, and prints the CMake arguments that build remat
# against it instead of the system's:
#
#   scripts/onednn3.sh [DIR]       DIR: default .deps/onednn-3.2 (ignored by git)
#   cmake --preset default -B build/onednn3 $(scripts/onednn3.sh)
#
# remat builds with either major version (kernels/detail/onednn.hpp); scripts/test.sh builds and
# runs the tests that go through oneDNN against this one. Needs curl and python3 (to unpack the
# wheels); nothing is installed system-wide. Progress goes to stderr, the arguments to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-.deps/onednn-3.2}"
base=https://files.pythonhosted.org/packages
wheels=(
  "65/b4/792e6d3ef02a0e14fdc0392bd378dc78f3c8356e6a40fda8c0b9366628a1/onednn_cpu_gomp-2023.2.0-py2.py3-none-manylinux1_x86_64.whl 2f22a54d6a890ed14bfa185d42a4be65d8b5b1df85dc1f0f3a9abe31620416fb"
  "d4/26/e1f06fc4810583d892831817e3217d32be475dd740c86c0b4058cec9d172/onednn_devel_cpu_gomp-2023.2.0-py2.py3-none-manylinux1_x86_64.whl 9763c69e8c907e119056bd52ad918ca84ac9ba939d130a99dfa95ccca3e5e284"
)
if [ ! -f "$dir/include/oneapi/dnnl/dnnl.hpp" ] || [ ! -f "$dir/lib/libdnnl.so.3" ]; then
  mkdir -p "$dir"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  for w in "${wheels[@]}"; do
    path="${w% *}" sum="${w#* }"
    file="$tmp/${path##*/}"
    echo "onednn3: fetching ${path##*/}" >&2
    curl -fsSL --retry 3 -o "$file" "$base/$path"
    echo "$sum  $file" | sha256sum -c --quiet - >&2
    python3 -m zipfile -e "$file" "$tmp/unpacked"
  done
  # (each wheel keeps its files under NAME.data/data/: lib/ in one, include/ in the other)
  rm -rf "$dir/include" "$dir/lib"
  cp -r "$tmp"/unpacked/onednn_devel_cpu_gomp-2023.2.0.data/data/include "$dir/"
  mkdir -p "$dir/lib"
  cp "$tmp"/unpacked/onednn_cpu_gomp-2023.2.0.data/data/lib/libdnnl.so.3 "$dir/lib/"
  echo "onednn3: oneDNN 3.2.0 in $dir" >&2
fi
dir="$(cd "$dir" && pwd)"
echo "-DREMAT_ONEDNN_INCLUDE_DIR=$dir/include -DREMAT_ONEDNN_LIBRARY=$dir/lib/libdnnl.so.3"
