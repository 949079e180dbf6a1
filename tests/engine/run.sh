#!/usr/bin/env bash
# Engine tests: real sglang 0.5.18 scheduler code on CPU, patched and pristine.
#   tests/engine/run.sh [pytest args]
# Sets up (or reuses) the engine environment, then runs pytest tests/engine with it.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
env_dir="$(bash "$repo/engine_image/test-env/setup.sh")"
export SLIPSTREAM_PATCHED_SGLANG="$env_dir/patched"
export SLIPSTREAM_ENGINE_ENV="$env_dir"
export PYTHONDONTWRITEBYTECODE=1
echo "==> [engine-test] $env_dir/bin/python -m pytest tests/engine (patched sglang: $SLIPSTREAM_PATCHED_SGLANG)" >&2
cd "$repo"
exec "$env_dir/bin/python" -m pytest -p no:cacheprovider -W ignore::UserWarning \
    -W ignore::DeprecationWarning tests/engine "$@"
