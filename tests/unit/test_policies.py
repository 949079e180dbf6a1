"""Policy names, their errors, and the auto policy changing settings between rounds."""

from __future__ import annotations

import pytest

from slipstream.sim import engine, policies, profiles, spec
from slipstream.sim.policies import EngineConfig, PolicyError, RoundView, Setting

CFG = EngineConfig()


@pytest.mark.parametrize("name, expect", [
    ("stock", ("stock", 0, "ceiling", "fcfs", False)),
    ("ceiling:4096", ("ceiling:4096", 4096, "ceiling", "fcfs", False)),
    ("floor:2048/srpt", ("floor:2048/srpt", 2048, "floor", "srpt", False)),
    ("sarathi:512", ("sarathi:512", 0, "ceiling", "fcfs", True)),
    ("vllm:1024/lpm", ("vllm:1024/lpm", 1024, "ceiling", "lpm", True)),
])
def test_parse(name, expect):
    p = policies.parse(name, CFG)
    assert (p.name, p.rule.threshold, p.rule.mode, p.order, p.mixed) == expect


@pytest.mark.parametrize("name, message", [
    ("fifo", "unknown policy"),
    ("ceiling", "needs a token count"),
    ("ceiling:abc", "not a token count"),
    ("floor:4096/random", "unknown order"),
    ("ceiling:99999", "<= chunked_prefill_size"),
    ("stock:5", "takes no argument"),
    ("auto", "needs a controller"),
])
def test_bad_names_say_what_is_wrong(name, message):
    with pytest.raises(PolicyError, match=message):
        policies.parse(name, CFG)


def test_auto_changes_threshold_mode_and_order_between_rounds():
    sp = spec.load("seed-000")
    seen: list[RoundView] = []

    def controller(view: RoundView) -> Setting | None:
        seen.append(view)
        return Setting(4096, "ceiling", "fcfs") if view.now_s >= 0.1 else None

    policy = policies.parse("auto", sp.engine, controller=controller, interval_s=0.1)
    result = engine.simulate(sp.workload, policy, profiles.load(sp.profile), sp.engine)
    assert result.settings and result.settings[0][1].threshold == 4096
    assert policy.rule.threshold == 4096
    assert seen[0].waiting_needs  # the controller saw the queue
    first = {j.rid: j.first_token_s for j in result.jobs}
    assert first["small-4"] < 5  # after the switch, small prompts slip past the cold one


def test_apply_refuses_a_bad_setting_and_keeps_the_old_one():
    p = policies.parse("ceiling:4096", CFG)
    with pytest.raises(ValueError):
        p.apply(Setting(5000 * 4, "ceiling", "fcfs"))
    assert p.rule.threshold == 4096
