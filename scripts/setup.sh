#!/usr/bin/env bash
# Installs what one purpose needs, and nothing that is already there:
#
#   scripts/setup.sh demo     build remat's examples and run the digits demo (scripts/demo.sh):
#                             a compiler, CMake, OpenBLAS, and Thrust/CUB when no CUDA toolkit
#                             brings them. The default.
#   scripts/setup.sh tests    the whole test suite (scripts/test.sh, CI): the demo's, plus Catch2,
#                             oneDNN, Open MPI, pkg-config, clang 19 with its sanitizer and OpenMP
#                             runtimes and clang 16 (the compilers CI builds with besides GCC),
#                             Debian's PyTorch (the peer the tests cross-check against), matplotlib
#                             (the plot scripts' tests), `fortunes` (charlm's corpus), Doxygen
#                             (the API reference's check) and curl (scripts/onednn3.sh)
#   scripts/setup.sh bench    the benchmarks (scripts/bench.sh): the tests' minus the extra
#                             compilers, plus SLEEF (a peer of the float maths), and today's PyTorch
#                             from PyPI (the speed peer; version pinned below, REMAT_TORCH_VERSION
#                             overrides it) in the virtual environment .venv-bench (Debian's
#                             python3-venv; python3-dev for torch.compile's C++ code; about 5 GB)
#   scripts/setup.sh cuda     the CUDA build (cmake --preset cuda; the toolkit itself is not a
#                             Debian package: CUDAToolkit_ROOT or /usr/local/cuda): the demo's plus
#                             Catch2 and Open MPI
#   scripts/setup.sh docs     the API reference (scripts/docs.sh): Doxygen
#
# Several purposes may be named; any other argument is a Debian package to install as well. As
# root it installs Debian packages itself; otherwise it uses sudo if it can, or says what to
# install.
set -euo pipefail

cuda_root="${CUDAToolkit_ROOT:-/usr/local/cuda}"
demo=(cmake make g++ gzip libopenblas-dev libopenblas0-openmp)
# Thrust and CUB: the CUDA toolkit's CCCL when it is here, Debian's otherwise.
if [ ! -f "$cuda_root/include/cccl/thrust/version.h" ] && [ ! -f "$cuda_root/include/thrust/version.h" ]; then
  demo+=(libthrust-dev libcub-dev)
fi
# (gcc and gfortran: the C interface's C11 and Fortran test programs, tests/capi/.)
peers=(catch2 gcc gfortran libdnnl-dev libopenmpi-dev openmpi-bin python3-torch python3-matplotlib fortunes)
# Today's PyTorch, the benchmarks' anchor: pinned, so figures taken on different days compare.
torch_version="${REMAT_TORCH_VERSION:-2.15.0}"
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv-bench"
want_venv=0
# (curl and ca-certificates: scripts/onednn3.sh fetches oneDNN 3.x from PyPI for a test stage)
tools=(pkg-config clang-19 libclang-rt-19-dev libomp-19-dev clang-16 doxygen curl ca-certificates)

packages=()
purposes=0
for arg in "$@"; do
  case "$arg" in
    demo) packages+=("${demo[@]}") ;;
    tests) packages+=("${demo[@]}" "${peers[@]}" "${tools[@]}") ;;
    bench) packages+=("${demo[@]}" "${peers[@]}" libsleef-dev python3-venv python3-dev); want_venv=1 ;;
    cuda) packages+=("${demo[@]}" catch2 libopenmpi-dev openmpi-bin) ;;
    docs) packages+=(doxygen) ;;
    *) packages+=("$arg"); continue ;;
  esac
  purposes=$((purposes + 1))
done
if [ "$purposes" -eq 0 ]; then packages+=("${demo[@]}"); fi

missing=()
for p in "${packages[@]}"; do
  case " ${missing[*]:-} " in *" $p "*) continue ;; esac
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# The PyPI PyTorch in .venv-bench, when it is not already the pinned version.
make_venv() {
  [ "$want_venv" -eq 1 ] || return 0
  if [ -x "$venv/bin/python" ] &&
     [ "$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)" = "$torch_version" ]; then
    return 0
  fi
  echo "remat setup: PyTorch $torch_version from PyPI into $venv"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "torch==$torch_version" numpy
  "$venv/bin/python" -c 'import torch; print("remat setup: PyTorch", torch.__version__, "in .venv-bench")'
}

if [ ${#missing[@]} -eq 0 ]; then
  make_venv
  exit 0
fi
echo "remat setup: installing ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo=(sudo)
else
  echo "remat setup: please install these Debian packages first: ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "remat setup: done"
make_venv
