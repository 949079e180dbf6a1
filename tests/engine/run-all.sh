#!/usr/bin/env bash
# The engine tier on every sglang version with a patch (0.5.18, 0.5.23), both at once:
#   tests/engine/run-all.sh [pytest args]
# Each version's environment is set up (or reused) first, one after the other (they share
# pip's cache); then the two pytest runs go side by side, each line of their output
# prefixed with its version. Each run keeps one core busy (one OpenMP thread, run.sh), so
# on this 2-core machine side by side takes about half the wall time of one after the
# other (docs/engine.md gives the figures). Exits non-zero when either run fails, after
# both have finished.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
versions=(0.5.18 0.5.23)
for v in "${versions[@]}"; do
    SGLANG_VERSION="$v" bash "$here/../../engine_image/test-env/setup.sh" >/dev/null || exit 1
done
pids=()
for v in "${versions[@]}"; do
    ( SGLANG_VERSION="$v" bash "$here/run.sh" "$@" 2>&1 | sed -u "s/^/[sglang $v] /"; exit "${PIPESTATUS[0]}" ) &
    pids+=("$!")
done
status=0
for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
        echo "==> [engine-test] sglang ${versions[$i]}: FAILED" >&2
        status=1
    fi
done
exit "$status"
