#!/usr/bin/env bash
# make test's tiers, scheduled to fill this 2-core machine (environments already set up):
#   tests/run-tiers.sh
# In the foreground, one after the other:
# 1. the cluster tests that wait on controllers and timers, on CLUSTER_WORKERS workers;
# 2. the tests marked `alone`, which keep a time scale: the closed loop, and beside it in a
#    second pytest process the others (the live loopbench, the fault tests that send
#    traffic, the integration test of the twin against two live simulators on cached
#    traffic; their output in a log file). Their own lag checks (the simulators' release
#    lag and the load's send lag against loopbench's bound) fail them when the time scale
#    was not kept; their captured output (-rP) carries the lag each one measured.
# Neither keeps both cores busy (the cluster tests wait on controllers, the alone tests'
# simulators on the scaled clock), so the CPU-bound tiers run beside them from the start
# at the idle scheduling class (`chrt --idle 0`, SCHED_IDLE): the engine tier (real
# sglang on CPU), then the unit and integration tiers. The kernel gives an idle-class
# thread a core only when no normal thread wants it, so the foreground keeps first call
# on the CPU. The background tiers' output goes to log files, printed in full once they
# finish. Exits non-zero when any tier failed, after every tier has finished.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PY:-.venv/bin/python}"
WORKERS="${WORKERS:-auto}"
CLUSTER_WORKERS="${CLUSTER_WORKERS:-2}"
logs="$(mktemp -d "${TMPDIR:-/tmp}/slipstream-tiers.XXXXXX")"
failed=()

clock() { date +%s; }
took() { local s=$(( $(clock) - $1 )); printf '%d min %02d s' $((s / 60)) $((s % 60)); }

tier() {  # NAME LOG COMMAND...: runs a background tier into $logs/LOG, noting a failure
    local name=$1 log=$2 t
    shift 2
    t=$(clock)
    "$@" > "$logs/$log" 2>&1 || echo "$name" >> "$logs/failed"
    echo "==> [tiers] $name (background): $(took "$t")" >> "$logs/$log"
}

background() {  # the CPU-bound tiers, one after the other, at the idle scheduling class
    tier engine engine.log bash tests/engine/run-all.sh --durations=10
    tier "unit+integration" unit.log "$PY" -m pytest tests/unit tests/integration -m "not alone" -n "$WORKERS" \
        --durations=10
}

t0=$(clock)
echo "==> [tiers] in the background at the idle class: the engine tier, then the unit and"
echo "    integration tiers (logs: $logs/engine.log, $logs/unit.log)"
export logs PY WORKERS
chrt --idle 0 bash -c "$(declare -f clock took tier background); background" &
bg=$!
echo "==> [tiers] cluster tests (not alone) on $CLUSTER_WORKERS workers"
t=$(clock)
"$PY" -m pytest tests/cluster -m "not alone" -n "$CLUSTER_WORKERS" --dist loadfile --durations=25 \
    || failed+=("cluster")
echo "==> [tiers] cluster tests (not alone): $(took "$t")"

echo "==> [tiers] alone tests: the closed loop here, the others beside it (log: $logs/alone.log)"
t=$(clock)
"$PY" -m pytest tests/cluster tests/integration -m alone --ignore=tests/cluster/test_closed_loop.py -rP --durations=5 \
    > "$logs/alone.log" 2>&1 &
others=$!
"$PY" -m pytest tests/cluster/test_closed_loop.py -m alone -rP --durations=5 || failed+=("closed loop")
wait "$others" || failed+=("alone")
echo "==> [tiers] alone tests: $(took "$t"); waiting for the background tiers"
wait "$bg"
for tier in alone engine unit; do
    echo "==> [tiers] ---- $tier log ----"
    cat "$logs/$tier.log" 2>/dev/null || echo "(no log: the tier did not start)"
done
if [[ -f "$logs/failed" ]]; then
    while read -r tier; do failed+=("$tier"); done < "$logs/failed"
fi
echo "==> [tiers] all tiers: $(took "$t0")"
if (( ${#failed[@]} )); then
    echo "==> [tiers] FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "==> [tiers] every tier passed"
