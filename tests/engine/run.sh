#!/usr/bin/env bash
# Engine tests: real sglang scheduler code on CPU, patched and pristine.
#   [SGLANG_VERSION=0.5.23] tests/engine/run.sh [pytest args]
# Sets up (or reuses) the engine environment of SGLANG_VERSION (default 0.5.18; see
# engine_image/test-env/setup.sh), then runs pytest tests/engine with it, patched and
# pristine (0.5.18 and 0.5.23 both have a patch). A version without a patch would get a
# pristine-only environment: only the tests that need pristine code alone would run there
# (PRISTINE_ONLY in tests/engine/conftest.py), and the run says so.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
export SGLANG_VERSION="${SGLANG_VERSION:-0.5.18}"
env_dir="$(bash "$repo/engine_image/test-env/setup.sh")"
export SLIPSTREAM_ENGINE_ENV="$env_dir"
export SLIPSTREAM_SGLANG_VERSION="$SGLANG_VERSION"
export PYTHONDONTWRITEBYTECODE=1
# One intra-op thread per run: torch's CPU work here is small tensor ops, and two runs side
# by side (run-all.sh), or a run beside make test's other tiers, with two OpenMP threads
# each on this 2-core machine spend the difference spinning in OpenMP's barriers
# (docs/engine.md#engine-tests gives the figures).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
patch_file="$repo/engine_image/patches/sglang-$SGLANG_VERSION-long-prefill.patch"
if [[ -f "$patch_file" ]]; then
    # This checkout's own copy (setup.sh names it by the patch's hash), not the shared link.
    export SLIPSTREAM_PATCHED_SGLANG="$env_dir/patched-$(sha256sum "$patch_file" | cut -c1-16)"
    echo "==> [engine-test] sglang $SGLANG_VERSION: $env_dir/bin/python -m pytest tests/engine (patched sglang: $SLIPSTREAM_PATCHED_SGLANG)" >&2
else
    unset SLIPSTREAM_PATCHED_SGLANG
    echo "==> [engine-test] sglang $SGLANG_VERSION has no patch: pristine-only tests (tests/engine/conftest.py PRISTINE_ONLY)" >&2
fi
cd "$repo"
exec "$env_dir/bin/python" -m pytest -p no:cacheprovider -W ignore::UserWarning \
    -W ignore::DeprecationWarning tests/engine "$@"
