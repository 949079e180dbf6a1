"""``auto``: the tuner in the twin's loop on a phased workload, and the CLI around it."""

from __future__ import annotations

import json
import random
from dataclasses import replace

from slipstream import cli
from slipstream.sim import engine, metrics, policies, profiles
from slipstream.sim.workload import BLOCK_SPACE, Request, Workload, build
from slipstream.tune import auto, guardrails, mixjump, observed
from slipstream.tune.candidates import concurrency
from slipstream.tune.guardrails import GuardrailSettings
from slipstream.tune.tuner import TunerSettings

PROFILE = profiles.load("kimi-k3-8xh200")
CFG = policies.EngineConfig()
PHASE_S = 600.0
INTERVAL_S = 60.0
COOLDOWN_S = 180.0


def phased(seed: int = 1) -> Workload:
    """Uniform 2000-token chat, then chat among cold 60K-150K documents and high-hit agents
    (about 60% prefill load), then uniform again; PHASE_S each."""
    rng = random.Random(seed)
    reqs: list[Request] = []

    def add(tenant: str, at: float, uncached: int, hit: float = 0.0) -> None:
        cached = int(uncached * hit / (1 - hit))
        k = {"chat": 1, "docs": 2, "agent": 3}[tenant] * BLOCK_SPACE + 2 * len(reqs)
        blocks, sizes, warm = ((k, k + 1), (cached, uncached), 1) if cached else ((k + 1,), (uncached,), 0)
        reqs.append(Request(f"r{len(reqs)}", tenant, at, uncached + cached, 20, blocks, sizes, warm))

    def poisson(rate: float, start: float, end: float) -> list[float]:
        out, t = [], start
        while (t := t + rng.expovariate(rate)) < end:
            out.append(t)
        return out

    for start in (0.0, 2 * PHASE_S):
        for t in poisson(4.0, start, start + PHASE_S):
            add("chat", t, 2000)
    for t in poisson(3.0, PHASE_S, 2 * PHASE_S):
        add("chat", t, rng.randint(1000, 3000))
    for t in poisson(0.04, PHASE_S, 2 * PHASE_S):
        add("docs", t, rng.randint(60000, 150000))
    for t in poisson(0.3, PHASE_S, 2 * PHASE_S):
        add("agent", t, rng.randint(500, 2000), 0.95)
    return build("phased", reqs)


def run_auto(workload: Workload) -> tuple[engine.SimResult, auto.TwinAuto]:
    policy = policies.parse("auto", CFG, controller=lambda view: None, interval_s=INTERVAL_S)
    settings = TunerSettings(guardrails=GuardrailSettings(interval_s=INTERVAL_S, cooldown_s=COOLDOWN_S))
    tuner = auto.TwinAuto(settings, PROFILE, CFG, auto.start_setting(policy), 2 * INTERVAL_S)
    policy.controller = tuner
    return engine.simulate(workload, policy, PROFILE, CFG), tuner


def test_auto_follows_the_phases_within_a_few_intervals_and_respects_the_cooldown():
    workload = phased()
    result, tuner = run_auto(workload)
    moves = tuner.moves()
    slack = 3 * INTERVAL_S + 5.0  # three intervals; a call waits for the next pass to start
    assert all(at >= PHASE_S for at, _ in moves), "moved during the first uniform phase"
    first_at, first = moves[0]
    assert first_at <= PHASE_S + slack
    assert first.to.threshold > 0  # concurrent prefills (srpt or not: the twin's call)
    back = [(at, m) for at, m in moves if at >= 2 * PHASE_S and concurrency(m.to, 8192) == 1]
    # Back to off within three intervals of the change, or, when a step taken while the
    # window still held heterogeneous traffic is cooling down, one interval after it ends;
    # or one interval after the calm (guardrails: a cap is loosened only after a cooldown
    # of near-uniform traffic) counted from the last window that was not near-uniform (the
    # heterogeneous phase's giants still prefilling give first tokens after it ends).
    assert back
    cooling = max((at + COOLDOWN_S + INTERVAL_S for at, _ in moves if at < back[0][0]), default=0.0)
    mixed_at = tuner.state.mixed_at
    assert mixed_at is not None and 2 * PHASE_S <= mixed_at < back[0][0]  # no window of phase 3 was mixed after it
    assert mixed_at <= 2 * PHASE_S + 2 * tuner.window_s + 5.0  # the giants' first tokens drain within the window
    calm = mixed_at + COOLDOWN_S + INTERVAL_S
    assert back[0][0] <= max(2 * PHASE_S + slack, cooling + 5.0, calm + 5.0)
    assert result.settings[-1][1].threshold == 0  # the run ends at off
    gaps = [b[0] - a[0] for a, b in zip(moves, moves[1:], strict=False)]
    assert all(gap >= COOLDOWN_S for gap in gaps), gaps
    assert [s for _, s in result.settings] == [m.to for _, m in moves]
    # The point of it all: the heterogeneous phase's worst tenant, tuned vs stock, over the
    # requests that arrived once the tuner had moved (before that both run stock).
    stock = engine.simulate(workload, policies.parse("stock", CFG), PROFILE, CFG)

    def worst(res: engine.SimResult) -> float:
        mid = [j for j in res.jobs if first_at <= j.arrival_s < 2 * PHASE_S]
        per = {}
        for j in mid:
            per.setdefault(j.req.tenant, []).append((j.first_token_s - j.arrival_s) / j.solo_s)
        return max(metrics.percentile(v, 99) for v in per.values())

    assert worst(result) < worst(stock) / 5


def test_auto_sees_only_the_past_window():
    seen: list[float] = []

    def spy(view: policies.RoundView) -> None:
        assert all(ft.first_token_s <= view.now_s for ft in view.first_tokens)
        seen.append(view.now_s)

    engine.simulate(phased(), policies.parse("stock", CFG, controller=spy, interval_s=INTERVAL_S),
                    PROFILE, CFG)
    snap = observed.snapshot_of("x", [], 100.0, 60.0)
    assert not snap.valid and snap.invalid == "NoTraffic"
    assert len(seen) > 20


def test_bench_runs_auto_on_the_builtin_workload(capsys):
    assert cli.main(["bench", "--workload", "builtin:multi-tenant", "--policies", "stock,auto",
                     "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["policies"]) == {"stock", "auto"}
    changes = out["tuner"]["auto"]["changes"]
    assert changes and changes[0]["from"] == "stock" and changes[0]["reason"].startswith("heterogeneity")
    held = out["tuner"]["auto"]["held"]
    assert sum(held.values()) + len(changes) == out["tuner"]["auto"]["decisions"] and "Cooldown" in held
    assert out["policies"]["auto"]["worst_tenant_slowdown_p99"] < out["policies"]["stock"]["worst_tenant_slowdown_p99"]


def test_simulate_auto_prints_its_changes(capsys):
    assert cli.main(["simulate", "--workload", "builtin:multi-tenant", "--policy", "auto/fcfs",
                     "--interval", "60", "--cooldown", "120"]) == 0
    out = capsys.readouterr().out
    assert "change(s) in" in out and "heterogeneity" in out


def test_recommend_cli_times_and_round_trips_a_snapshot(tmp_path, capsys):
    dump = tmp_path / "snap.json"
    assert cli.main(["recommend", "--workload", "builtin:multi-tenant", "--at", "600", "--window", "300",
                     "--dump-snapshot", str(dump), "--time"]) == 0
    first = capsys.readouterr().out
    assert "recommendation:" in first and "time:" in first
    # The model check, as the operator makes it (a logged ModelMismatch window replays here).
    (check,) = [line for line in first.splitlines() if line.startswith("model check: ")]
    assert check.endswith(": agrees") or check.endswith(": disagrees: the operator holds (ModelMismatch)"), check
    assert cli.main(["recommend", "--snapshot", str(dump), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reason"].startswith("heterogeneity") and len(out["candidates"]) >= 9
    model = out["model"]
    assert isinstance(model["agrees"], bool) and model["band"] == 4.0 and model["tenants"], model
    assert {"name", "predicted_p99_ttft_s", "observed_p99_ttft_s"} <= set(model["tenants"][0])
    assert check.endswith(": agrees") == model["agrees"]


def test_recommend_cli_refuses_a_bad_snapshot(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"deployment": "a/b", "taken_at": 0, "window_s": 60,
                               "tenants": [{"name": "x"}]}))
    assert cli.main(["recommend", "--snapshot", str(bad)]) == 2
    assert "tenants[0] needs name and requests_per_s" in capsys.readouterr().err


def run_operator_loop(workload: Workload, analysis_s: float, mix_poll_s: float) -> tuple[engine.SimResult, auto.TwinAuto]:
    """``auto`` with the operator's timing: the rollout in flight for ``analysis_s``, the mix polled."""
    settings = TunerSettings(guardrails=GuardrailSettings(interval_s=INTERVAL_S, cooldown_s=COOLDOWN_S))
    tuner = auto.TwinAuto(settings, PROFILE, CFG, policies.Setting(0, "ceiling", "fcfs"), INTERVAL_S,
                          interval_s=INTERVAL_S, analysis_s=analysis_s, mix_poll_s=mix_poll_s)  # fmt: skip
    policy = policies.parse("auto", CFG, controller=tuner, interval_s=tuner.call_s)
    return engine.simulate(workload, policy, PROFILE, CFG), tuner


def test_the_operators_timing_holds_through_the_analysis_and_cools_down_from_the_promotion():
    analysis = 120.0
    _, tuner = run_operator_loop(phased(), analysis, 0.0)
    moves = tuner.moves()
    assert moves, tuner.held()
    for at, _ in moves:  # while the rollout is in flight, every step holds for it
        during = [d for t, d in tuner.decisions if at < t < at + analysis - 1e-6]
        assert during and all(d.reason == guardrails.ROLLOUT_IN_PROGRESS for d in during), during
    gaps = [b[0] - a[0] for a, b in zip(moves, moves[1:], strict=False)]
    assert all(gap >= analysis + COOLDOWN_S for gap in gaps), gaps  # cooldown from the promotion
    assert tuner.call_s == INTERVAL_S and tuner.early_steps == 0


def test_a_mix_jump_steps_before_the_timer():
    _, timer = run_operator_loop(phased(), 120.0, 0.0)
    _, polled = run_operator_loop(phased(), 120.0, 10.0)
    assert polled.call_s == 10.0 and polled.early_steps >= 1
    first_timer = next(at for at, _ in timer.moves())
    first_polled = next(at for at, _ in polled.moves())
    assert PHASE_S <= first_polled < first_timer, (first_polled, first_timer)


def test_auto_reuses_the_twin_run_while_the_workload_has_not_moved_and_reruns_when_it_does():
    """The operator's tuner memo in the twin's loop (``reuse_s``): a step on the same traffic
    under the same setting reuses the last run's recommendation; the phase change runs the
    twin again at once."""
    policy = policies.parse("auto", CFG, controller=lambda view: None, interval_s=INTERVAL_S)
    settings = TunerSettings(guardrails=GuardrailSettings(interval_s=INTERVAL_S, cooldown_s=COOLDOWN_S))
    tuner = auto.TwinAuto(settings, PROFILE, CFG, auto.start_setting(policy), 2 * INTERVAL_S, reuse_s=600.0)
    policy.controller = tuner
    engine.simulate(phased(), policy, PROFILE, CFG)
    recs = [(at, d.recommendation) for at, d in tuner.decisions if d.recommendation is not None]
    fresh = [at for k, (at, rec) in enumerate(recs) if k == 0 or rec is not recs[k - 1][1]]
    assert tuner.memo is not None and tuner.memo.runs == len(fresh)
    assert tuner.memo.runs + tuner.memo.reused == len(recs)
    uniform = [at for at, _ in recs if 2 * INTERVAL_S <= at < PHASE_S]  # a full window of uniform chat
    assert len([at for at in fresh if 2 * INTERVAL_S <= at < PHASE_S]) < len(uniform) - 2, (fresh, uniform)
    # the first step whose window holds the new phase's traffic runs the twin again
    first_new = min(at for at, _ in recs if at > PHASE_S)
    assert first_new in fresh, (first_new, fresh)


def test_auto_without_reuse_runs_the_twin_every_step():
    tuner = auto.TwinAuto(TunerSettings(), PROFILE, CFG, policies.Setting(0, "ceiling", "fcfs"), INTERVAL_S)
    assert tuner.memo is None
    reusing = auto.TwinAuto(TunerSettings(), PROFILE, CFG, policies.Setting(0, "ceiling", "fcfs"), INTERVAL_S,
                            reuse_s=600.0)
    assert reusing.memo is not None and reusing.memo.max_age_s == 600.0


def voiding_auto(candidate: policies.Setting) -> tuple[auto.TwinAuto, list[policies.Setting | None]]:
    """``auto`` with the operator's timing, its first step held (no traffic yet), then a
    rollout of ``candidate`` in flight decided on chat turns alone, then giants waiting at
    the next poll and the one after: (the tuner, what it told the engine at each call)."""
    stock = policies.Setting(0, "ceiling", "fcfs")
    settings = TunerSettings(guardrails=GuardrailSettings(interval_s=INTERVAL_S, cooldown_s=COOLDOWN_S))
    tuner = auto.TwinAuto(settings, PROFILE, CFG, stock, INTERVAL_S, interval_s=INTERVAL_S, analysis_s=120.0,
                          mix_poll_s=10.0)  # fmt: skip
    said = [tuner(policies.RoundView(0.0, (), (), 0))]
    tuner._rollout = (125.0, candidate)
    tuner.state = replace(tuner.state, rollout_in_progress=True)
    tuner._watch = mixjump.MixWatch(mixjump.shares({"le8k": 1.0}, 100.0), tops=(1,))
    for now in (10.0, 20.0):
        chat = tuple(policies.FirstToken("chat", now - 9 + i * 0.2, now - 8.9 + i * 0.2, 2000, 2000) for i in range(30))
        said.append(tuner(policies.RoundView(now, (350_000, 350_000, 350_000), (), 0, chat)))
    return tuner, said


def test_a_mix_jump_voids_a_rollout_that_does_not_cap_harder_as_the_operator_does():
    # An order-only candidate: the giants' first poll voids it and steps at once, on the
    # rollout as voided; that step holds (a window of chat turns alone), so the engine
    # goes back to stock, the cooldown runs from then, and the next poll that still sees
    # the giants steps early again (the jump is retried).
    tuner, said = voiding_auto(policies.Setting(0, "ceiling", "srpt"))
    assert said[:2] == [None, policies.Setting(0, "ceiling", "fcfs")], said
    assert tuner.voided == 1 and tuner._rollout is None and not tuner.state.rollout_in_progress
    assert tuner.state.last_step_at == 10.0 and tuner.state.current == policies.Setting(0, "ceiling", "fcfs")
    assert tuner.early_steps == 2 and [t for t, _ in tuner.decisions[1:]] == [10.0, 20.0], tuner.decisions
    assert all(d.reason != guardrails.ROLLOUT_IN_PROGRESS for _, d in tuner.decisions), tuner.decisions
    # A harder cap goes on: the way a jump to giants needs.
    harder, said = voiding_auto(policies.Setting(4096, "ceiling", "srpt"))
    assert harder.voided == 0 and harder._rollout is not None and said[1:] == [None, None]


def test_the_step_that_voids_a_rollout_may_move_at_once(monkeypatch):
    # The voiding step's decision goes out in the same call: a harder cap reaches the
    # engine at the poll that saw the jump, not a poll later.
    cap = policies.Setting(4096, "ceiling", "srpt")
    real = auto.tune_once

    def capping(snapshot, state, *args, **kwargs):
        decision = real(snapshot, state, *args, **kwargs)
        assert not state.rollout_in_progress, "the voiding step judges the rollout as over"
        if state.mix_jumped and decision.recommendation is not None:
            return guardrails.Move(state.current, cap, "giants: cap", decision.recommendation)
        return decision

    monkeypatch.setattr(auto, "tune_once", capping)
    tuner, said = voiding_auto(policies.Setting(0, "ceiling", "srpt"))
    assert said[1] == cap and tuner.voided == 1, said
    assert tuner._rollout is not None and tuner._rollout[1] == cap and tuner.state.rollout_in_progress
    assert said[2] is None  # the cap's rollout is in flight and not voidable: no second step



def test_auto_on_little_data_pools_its_window_and_moves_when_the_mix_changes(capsys):
    """Fewer than 50 first tokens a minute (12K-90K-token documents at 70% busy), giants
    among them from 600 s to 1200 s of the spec: with a fixed floor of 50 every decision
    held TooFewSamples and auto stayed stock (tune/pooling.py); pooled, it moves once the
    giants come, and its worst tenant beats stock's."""
    assert cli.main(["bench", "--workload", "examples/workloads/little-data.yaml", "--target-utilization", "0.7",
                     "--policies", "stock,auto", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    tuner, scale = out["tuner"]["auto"], out["rate_scale"]
    per_minute = out["policies"]["stock"]["requests"] / (1800.0 / scale) * 60.0
    assert per_minute < 50, f"{per_minute:.0f} first tokens a minute: not little data"
    assert tuner["held"].get("TooFewSamples", 0) < tuner["decisions"] / 2, tuner["held"]
    giants_from, giants_to = 640.0 / scale, 1100.0 / scale
    assert tuner["changes"], tuner["held"]
    first = tuner["changes"][0]
    assert giants_from <= first["at_s"] <= giants_to and first["to"] != "stock", tuner["changes"]
    p99 = {name: policy["worst_tenant_slowdown_p99"] for name, policy in out["policies"].items()}
    assert p99["auto"] < 0.6 * p99["stock"], p99
