#!/usr/bin/env bash
# The GPU checks, on a host with CUDA and torch (python3 on PATH): builds Horovod if it is not there
# (ci/gpu/build_horovod.sh), installs hvd-elastic, runs tests/test_gpu.py, then (unless --no-bench) the GPU scale
# benchmark: `python benchmarks/scale.py --device cuda ...` (docs/design.md, "CUDA"). Logs and JSON go to $OUT
# (default: ./gpu-out). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT="${OUT:-$PWD/gpu-out}"; mkdir -p "$OUT"; export OUT
BENCH=1
if [ "${1:-}" = "--no-bench" ]; then BENCH=0; shift; fi
python3 -c 'import horovod.torch' 2>/dev/null || bash ci/gpu/build_horovod.sh
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
  || { tail -30 "$OUT/install.log"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt" || true
status=0
python3 -m pytest -p no:cacheprovider -ra tests/test_gpu.py "$@" 2>&1 | tee "$OUT/pytest.log" || status=$?
if [ "$BENCH" = 1 ]; then
  python3 benchmarks/scale.py --device cuda --launcher horovodrun --sizes 10,100 --ranks 2 --repeats 2 --steps 20 \
    --json "$OUT/scale-gpu.json" 2>&1 | tee "$OUT/scale-gpu.log" || status=1
  python3 benchmarks/scale.py --device cuda --launcher horovodrun --sizes 10,100 --ranks 2 --repeats 2 --steps 20 \
    --slowdown 3 --json "$OUT/scale-gpu-slow.json" 2>&1 | tee "$OUT/scale-gpu-slow.log" || status=1
fi
exit $status
