#!/usr/bin/env bash
# The README's main command: a 4-rank heterogeneous-cluster demo on localhost (rank 3 an emulated straggler),
# trained under the policy in HVD_ELASTIC_POLICY (default bsp). Usage: bash ci/demo.sh [horovodrun|mpirun]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source ci/env.sh
LAUNCHER="${1:-horovodrun}"
export HVD_ELASTIC_EMULATE_DELAY="${HVD_ELASTIC_EMULATE_DELAY:-*:0.005,3:0.03}"
echo "[demo] policy=${HVD_ELASTIC_POLICY:-bsp} emulate_delay=$HVD_ELASTIC_EMULATE_DELAY launcher=$LAUNCHER"
case "$LAUNCHER" in
  horovodrun) exec horovodrun -np 4 -H localhost:4 --gloo python examples/torch_digits.py ;;
  mpirun) exec mpirun --oversubscribe --bind-to none -np 4 python examples/torch_digits.py ;;
  *) echo "ci/demo.sh: launcher must be horovodrun or mpirun, got '$LAUNCHER'" >&2; exit 2 ;;
esac
