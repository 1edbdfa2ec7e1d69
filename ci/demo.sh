#!/usr/bin/env bash
# The README's demo: one straggler job (4 ranks on localhost, rank 3 an emulated straggler, a small model on
# scikit-learn's digits) trained twice, under plain bsp and under the policy "Which policy" recommends for a persistent
# straggler (wbsp with overlap; HVD_ELASTIC_POLICY=... chooses another), then one comparison: wall time, test
# accuracy, each rank's wait share, and the speed-up. Usage: bash ci/demo.sh [horovodrun|mpirun]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source ci/env.sh
LAUNCHER="${1:-horovodrun}"
POLICY="${HVD_ELASTIC_POLICY:-wbsp}"
if [ "$POLICY" = wbsp ] && [ -z "${HVD_ELASTIC_WBSP_OVERLAP:-}" ]; then export HVD_ELASTIC_WBSP_OVERLAP=1; fi
unset HVD_ELASTIC_POLICY
export HVD_ELASTIC_EMULATE_DELAY="${HVD_ELASTIC_EMULATE_DELAY:-*:0.005,3:0.03}" HVD_ELASTIC_REPORT=0
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
run() {   # run POLICY: one job; its report and summary go to $OUT/POLICY.*
  case "$LAUNCHER" in
    horovodrun) set -- horovodrun -np 4 -H localhost:4 --gloo ;;
    mpirun) set -- mpirun --oversubscribe --bind-to none -np 4 ;;
    *) echo "ci/demo.sh: launcher must be horovodrun or mpirun, got '$LAUNCHER'" >&2; exit 2 ;;
  esac
  HVD_ELASTIC_POLICY="$POLICY_RUN" HVD_ELASTIC_REPORT_JSON="$OUT/$POLICY_RUN.report.json" \
    "$@" python examples/torch_digits.py --summary "$OUT/$POLICY_RUN.summary.json" >"$OUT/$POLICY_RUN.log" 2>&1 \
    || { echo "[demo] the $POLICY_RUN job failed:" >&2; tail -20 "$OUT/$POLICY_RUN.log" >&2; exit 1; }
}
echo "[demo] 4 ranks, emulated delay $HVD_ELASTIC_EMULATE_DELAY (rank 3 the straggler), launcher $LAUNCHER"
for POLICY_RUN in bsp "$POLICY"; do
  echo "[demo] training under $POLICY_RUN ..."
  run
done
python ci/demo_compare.py "$OUT" bsp "$POLICY"
