#!/usr/bin/env bash
# The README's test command: sets up everything it needs (ci/bootstrap.sh), then runs the whole test suite.
# Extra arguments go to pytest (e.g. `bash ci/test.sh -k config`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source ci/env.sh
echo "[test] python: $(command -v python)"
python -m pytest tests -ra --durations=0 --durations-min=10 "$@"   # every test of 10 s or more, slowest first
