#!/usr/bin/env bash
# On a machine with a package registry: put what a GPU host without one needs into ci/gpu/cache/ (git-ignored):
# Horovod's sdist. Then copy the checkout (with ci/gpu/cache) to the GPU host and run `bash ci/gpu/run_tests.sh`.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$HERE/cache"
[ -f "$HERE/cache/horovod-0.28.1.tar.gz" ] || \
  python3 -m pip download -q --no-deps --no-binary :all: -d "$HERE/cache" horovod==0.28.1
ls -l "$HERE/cache"
