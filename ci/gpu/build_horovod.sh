#!/usr/bin/env bash
# Build and install Horovod 0.28.1 on a GPU host: PyTorch + Gloo, CUDA-aware, without NCCL (NCCL refuses two ranks on
# one GPU, and the GPU tests put two ranks on cuda:0), into the python3 on PATH (which has torch with CUDA).
# Usage: bash ci/gpu/build_horovod.sh [SDIST]  (default: ci/gpu/cache/horovod-0.28.1.tar.gz, which
# `bash ci/gpu/prepare.sh` downloads on a machine with a package registry). About 2 minutes on 16 cores.
# The fixes, each needed with torch 2.11+ / CUDA 13 / GCC 13 / CMake 4: C++17 (PyTorch headers), no setup_requires
# (cffi cannot be fetched on a host without a registry), the includes GCC 13 no longer pulls in, CUDA standard 17 and
# compute capability 90 only (CUDA 13 dropped the old ones), CMake 4's minimum-version escape for Gloo.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SDIST="${1:-$HERE/cache/horovod-0.28.1.tar.gz}"
[ -f "$SDIST" ] || { echo "build_horovod: no Horovod sdist at $SDIST (run bash ci/gpu/prepare.sh first)" >&2; exit 1; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
tar xzf "$SDIST" -C "$WORK"
SRC="$WORK/horovod-0.28.1"
sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
sed -i 's/setup_requires=require_list if is_build_action() else \[\]/setup_requires=[]/' "$SRC/setup.py"
sed -i 's/set(CMAKE_CUDA_STANDARD 11)/set(CMAKE_CUDA_STANDARD 17)/' "$SRC/horovod/common/ops/cuda/CMakeLists.txt"
export CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
  HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-90}" \
  CXXFLAGS='-include cstdint -include string -include stdexcept'
LOG="${OUT:-/tmp}/horovod-build.log"
t0=$(date +%s)
(cd "$SRC" && python3 -m pip install -q --no-deps --no-build-isolation --no-cache-dir . >"$LOG" 2>&1) \
  || { echo "build_horovod: Horovod build failed; tail of $LOG:" >&2; tail -30 "$LOG" >&2; exit 1; }
echo "build_horovod: built in $(( $(date +%s) - t0 )) s"
python3 -c 'import horovod.torch as h; print("horovod gloo", h.gloo_built(), "nccl", h.nccl_built(), "cuda", h.cuda_built())'
