"""In Auto the tuner holds while a rollout is in flight (guardrail RolloutInProgress), so the
controller passes no target: the rollout must go on to its analysis, not roll back as if
the target had changed (found by the closed-loop demo: every canary was rolled back)."""

from __future__ import annotations

from test_rollout_machine import AUTO, NEW, PASS, POLICY, T0, fleet


def test_no_target_while_in_flight_lets_the_rollout_finish() -> None:
    f = fleet()
    assert f.step(AUTO, T0).action == "StartCanary"
    assert f.step(None, T0 + 1).action == "StartAnalysis"
    end = T0 + 1 + POLICY.analysis_window_s
    assert f.step(None, T0 + 10).action == "Hold"
    d = f.step(None, end + 1, PASS)
    assert d.action != "RollBack", d.message
    for t in range(2, 6):
        if f.state is not None and f.state.phase == "Idle":
            break
        f.step(None, end + t, PASS)
    assert f.fleet == NEW and set(f.settings.values()) == {NEW}, (f.actions, f.state)
