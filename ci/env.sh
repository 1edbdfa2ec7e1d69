# Source me: runs the idempotent bootstrap (quietly, if already done) and puts the project venv first on PATH.
_HVDE_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_HVDE_VENV_LINE="$(bash "$_HVDE_ROOT/ci/bootstrap.sh" | tail -1)" || { echo "bootstrap failed" >&2; return 1 2>/dev/null || exit 1; }
# Not HVD_ELASTIC_*: that prefix is the plugin's settings, and it refuses names it does not know.
export HVDE_VENV="${_HVDE_VENV_LINE#VENV=}"
export PATH="$HVDE_VENV/bin:$PATH"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# TensorFlow's own logging setting: its start-up lines (CPU features, oneDNN) are INFO; warnings and errors stay.
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-1}"
