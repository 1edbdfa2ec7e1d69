#!/usr/bin/env bash
# Idempotent environment bootstrap for hvd-elastic on Debian 12 / Python 3.11 (no GPU needed).
#
# Creates (or reuses) a virtual environment with the pinned stack of ci/requirements.txt, builds Horovod 0.28.1
# from its PyPI sdist with two source fixes (see below), caches the built wheel, and installs hvd-elastic itself
# in editable mode (which compiles the native scheduler, hvd_elastic._native).
#
# Environment:
#   HVD_ELASTIC_CACHE  cache folder for the venv and the Horovod wheel (default: ~/.cache/hvd-elastic)
#   HVD_ELASTIC_VENV   venv path (default: $HVD_ELASTIC_CACHE/venv-<hash of requirements>)
#
# Prints the venv path as the last line on stdout ("VENV=<path>").
set -euo pipefail
# TensorFlow's own logging setting: its start-up lines (CPU features, oneDNN) are INFO; warnings and errors stay.
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-1}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${HVD_ELASTIC_CACHE:-$HOME/.cache/hvd-elastic}"
REQ="$ROOT/ci/requirements.txt"
HOROVOD_VERSION=0.28.1
REQ_HASH="$( (cat "$REQ"; echo "horovod=$HOROVOD_VERSION"; python3 --version) | sha256sum | cut -c1-12)"
VENV="${HVD_ELASTIC_VENV:-$CACHE/venv-$REQ_HASH}"
mkdir -p "$CACHE/wheels" "$CACHE/logs"
log() { echo "[bootstrap] $*" >&2; }

# --- 1. System packages: OpenMPI (Horovod's MPI controller, mpirun, mpi4py) and a cmake Gloo accepts. --------------
need_apt=()
command -v mpirun >/dev/null 2>&1 || need_apt+=(openmpi-bin)
[ -e /usr/include/x86_64-linux-gnu/openmpi/mpi.h ] || [ -e /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ] \
  || need_apt+=(libopenmpi-dev)
# Debian's cmake 3.25: pip's cmake 4.x rejects Gloo's old cmake_minimum_required.
command -v cmake >/dev/null 2>&1 || need_apt+=(cmake)
command -v g++ >/dev/null 2>&1 || need_apt+=(g++)
if [ ${#need_apt[@]} -gt 0 ]; then
  log "installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >"$CACHE/logs/apt.log" 2>&1 \
    || { log "apt-get install failed; see $CACHE/logs/apt.log"; tail -20 "$CACHE/logs/apt.log" >&2; exit 1; }
fi

# --- 2. The virtual environment with the pinned stack. ---------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv $VENV"
  python3 -m venv "$VENV"
fi
PY="$VENV/bin/python"
STAMP="$VENV/.requirements-ok"
if [ ! -e "$STAMP" ] || ! cmp -s "$REQ" "$STAMP"; then
  log "installing pinned requirements (torch CPU, tensorflow-cpu, mpi4py, ...)"
  "$PY" -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" >&2 || true
  "$PY" -m pip install -q -r "$REQ" 2>&1 | grep -v "^WARNING: Location" >&2 || true
  "$PY" -c "import torch, tensorflow, mpi4py, pybind11, pytest, hypothesis, sklearn" \
    || { log "pinned requirements did not install"; exit 1; }
  cp "$REQ" "$STAMP"
fi

# --- 3. Horovod 0.28.1 from source, cached as a wheel. ---------------------------------------------------------------
# Versions from the packages' metadata (importing torch and TensorFlow here would cost seconds on every call).
read -r TORCH_V TF_V PY_V < <("$PY" -c 'import importlib.metadata as m, sys
print(m.version("torch"), m.version("tensorflow-cpu"), "%d%d" % sys.version_info[:2])')
MPI_V="$(mpirun --version 2>/dev/null | head -1 | awk '{print $NF}')"
WHEEL_KEY="hvd${HOROVOD_VERSION}-torch${TORCH_V}-tf${TF_V}-ompi${MPI_V}-py${PY_V}"
WHEEL_DIR="$CACHE/wheels/$WHEEL_KEY"
# A stamp written once this Horovod imported with both frameworks: later calls skip the (slow) import check.
HVD_STAMP="$VENV/.horovod-ok"
if { [ "$(cat "$HVD_STAMP" 2>/dev/null)" != "$WHEEL_KEY" ] \
     || ! "$PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("horovod") is None)' 2>/dev/null; } \
   && { ! "$PY" -c 'import horovod, sys; sys.exit(0 if horovod.__version__ == "'$HOROVOD_VERSION'" else 1)' 2>/dev/null \
        || ! "$PY" -c 'import horovod.torch, horovod.tensorflow' 2>/dev/null; }; then
  if ! ls "$WHEEL_DIR"/horovod-*.whl >/dev/null 2>&1; then
    log "building Horovod $HOROVOD_VERSION wheel (a few minutes; cached in $WHEEL_DIR)"
    BUILD="$(mktemp -d)"
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$BUILD" "horovod==$HOROVOD_VERSION" 2>&1 \
      | grep -v "^WARNING: Location" >&2 || true
    tar -xzf "$BUILD"/horovod-$HOROVOD_VERSION.tar.gz -C "$BUILD"
    SRC="$BUILD/horovod-$HOROVOD_VERSION"
    # Fix 1: PyTorch >= 2.1 headers require C++17; Horovod 0.28.1 compiles as C++14 (fixed on master, PR #3998,
    # never released).
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$SRC/CMakeLists.txt" \
      "$SRC/horovod/torch/CMakeLists.txt"
    # Fix 2: with TensorFlow 2.21 the optional XLA ops (only used with HOROVOD_ENABLE_XLA_OPS) fail to compile
    # (highwayhash headers missing); drop that one source file from the TensorFlow extension.
    sed -i '/xla_mpi_ops.cc/d' "$SRC/horovod/tensorflow/CMakeLists.txt"
    grep -q 'CMAKE_CXX_STANDARD 17' "$SRC/horovod/torch/CMakeLists.txt" || { log "C++17 fix did not apply"; exit 1; }
    mkdir -p "$WHEEL_DIR"
    ( cd "$SRC" && env MAKEFLAGS=-j2 HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 PATH="/usr/bin:$PATH" \
        "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WHEEL_DIR" . ) \
        >"$CACHE/logs/horovod-build.log" 2>&1 || { log "Horovod build failed; see $CACHE/logs/horovod-build.log";
                                                   tail -40 "$CACHE/logs/horovod-build.log" >&2; exit 1; }
    rm -rf "$BUILD"
  else
    log "using cached Horovod wheel $WHEEL_DIR"
  fi
  "$PY" -m pip install -q --no-deps --force-reinstall "$WHEEL_DIR"/horovod-*.whl 2>&1 | grep -v "^WARNING: Location" >&2 || true
  "$PY" -c "import horovod.torch, horovod.tensorflow" || { log "Horovod did not install"; exit 1; }
fi
echo "$WHEEL_KEY" > "$HVD_STAMP"

# --- 4. hvd-elastic itself (editable; compiles native/ into hvd_elastic._native). ------------------------------------
# Skipped when this checkout's compiled module is newer than every native source, setup.py and pyproject.toml, and
# the venv's hvd_elastic is this checkout's (an editable install made from another clone, e.g. a CI clone since
# deleted, would leave `python examples/...` run from here without the package).
SO="$(ls "$ROOT"/hvd_elastic/_native*.so 2>/dev/null | head -1 || true)"
if [ -n "$SO" ] && [ -z "$(find "$ROOT/native" "$ROOT/setup.py" "$ROOT/pyproject.toml" -newer "$SO" -type f | head -1)" ] \
   && (cd / && "$PY" -c "import os, sys, hvd_elastic._native; sys.exit(os.path.realpath(os.path.dirname(hvd_elastic.__file__)) != os.path.realpath('$ROOT/hvd_elastic'))") 2>/dev/null; then
  echo "VENV=$VENV"
  exit 0
fi
log "building hvd-elastic (native scheduler)"
( cd "$ROOT" && "$PY" -m pip install -q --no-deps --no-build-isolation -e . ) >"$CACHE/logs/hvd-elastic-build.log" 2>&1 \
  || { log "pip install -e . failed; see $CACHE/logs/hvd-elastic-build.log"; tail -30 "$CACHE/logs/hvd-elastic-build.log" >&2; exit 1; }
echo "VENV=$VENV"
