"""The twin as a steppable object (INTERFACES.md A): the same passes as ``simulate``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slipstream.sim import engine, policies, profiles, rate
from slipstream.sim.engine import Engine
from slipstream.sim.policies import EngineConfig, Setting
from slipstream.sim.workload import Request, build

PROFILE = profiles.load("kimi-k3-8xh200")
CFG = EngineConfig(chunked_prefill_size=8192, cache_tokens=200_000)


def mix() -> list[Request]:
    return [Request(f"r{k}", f"t{k % 2}", k * 0.7, 2000 + 7919 * k % 40_000, 3 + k % 7,
                    (k % 4 + 1, 1000 + k), (512, 2000 + 7919 * k % 40_000 - 512))
            for k in range(30)]


@pytest.mark.parametrize("policy", ["stock", "ceiling:2048/srpt", "floor:4096", "sarathi:4096"])
def test_a_server_loop_submitting_on_arrival_serves_every_request(policy):
    """As the engine simulator drives it: submit when the clock reaches a request."""
    eng = Engine(policies.parse(policy, CFG), PROFILE, CFG)
    jobs = []
    for req in mix():
        eng.advance(req.arrival_s)
        # a pass may have run past the arrival: the request arrives when it ends
        jobs.append(eng.submit(replace(req, arrival_s=max(req.arrival_s, eng.now_s))))
        assert eng.waiting + eng.partials + eng.decoding >= 1 or jobs[-1].first_token_s > 0
    eng.run()
    assert not eng.busy
    assert all(j.first_token_s > j.arrival_s and j.finished_s >= j.first_token_s for j in jobs)


def test_submitting_ahead_and_advancing_in_steps_matches_simulate_exactly():
    reqs = mix()
    for policy in ("stock", "ceiling:2048/srpt", "vllm:4096"):
        whole = engine.simulate(build("w", reqs), policies.parse(policy, CFG), PROFILE, CFG)
        eng = Engine(policies.parse(policy, CFG), PROFILE, CFG)
        jobs = [eng.submit(r) for r in reqs]
        t = 0.0
        while eng.busy or eng.waiting or t < reqs[-1].arrival_s:
            t += 0.1
            eng.advance(t)
            assert eng.now_s >= t
        assert [j.first_token_s for j in jobs] == [j.first_token_s for j in whole.jobs]
        assert [j.finished_s for j in jobs] == [j.finished_s for j in whole.jobs]


def test_advance_runs_passes_that_start_by_until_and_idles_to_until():
    eng = Engine(policies.parse("stock", CFG), PROFILE, CFG)
    eng.advance(5.0)
    assert eng.now_s == 5.0 and not eng.busy
    job = eng.submit(Request("a", "t", 5.0, 20_000, 4, (1,), (20_000,)))
    eng.advance(5.0)  # the first pass starts at 5.0 and ends after it
    assert eng.now_s > 5.0 and eng.partials == 1 and eng.waiting == 0
    with pytest.raises(ValueError, match="arrival_s >= now_s"):
        eng.submit(Request("late", "t", 4.0, 10, 1, (2,), (10,)))
    eng.advance(1000.0)
    assert job.first_token_s > 5.0 and job.finished_s > job.first_token_s
    assert eng.decoding == 0 and not eng.busy and eng.now_s == 1000.0


def test_tokens_out_streams_one_token_per_decode_step():
    eng = Engine(policies.parse("stock", CFG), PROFILE, CFG)
    job = eng.submit(Request("a", "t", 0.0, 1000, 5, (1,), (1000,)))
    eng.run()
    assert job.tokens_out(job.first_token_s - 1e-9) == 0
    assert job.tokens_out(job.first_token_s) == 1
    assert job.tokens_out(job.finished_s - 1e-9) == 4
    assert job.tokens_out(job.finished_s) == 5
    assert job.tokens_out(job.finished_s + 100) == 5


def test_apply_changes_the_setting_between_passes_and_abort_drops_a_waiting_request():
    eng = Engine(policies.parse("stock", CFG), PROFILE, CFG)
    a = eng.submit(Request("a", "t", 0.0, 40_000, 1, (1,), (40_000,)))
    b = eng.submit(Request("b", "t", 0.0, 40_000, 1, (2,), (40_000,)))
    c = eng.submit(Request("c", "t", 0.0, 500, 1, (3,), (500,)))
    eng.advance(0.0)  # stock: a takes the whole budget, b and c wait
    assert eng.partials == 1 and eng.waiting == 2
    assert eng.abort("c") and not eng.abort("c") and not eng.abort("a")
    eng.apply(Setting(threshold=4096, mode="ceiling", order="fcfs"))
    eng.advance(eng.now_s)
    assert eng.partials == 2 and eng.waiting == 0  # two partials at once now
    eng.run()
    assert a.first_token_s > 0 and b.first_token_s > 0 and c.first_token_s == -1
    assert eng.settings[0][1].threshold == 4096


def test_rate_reuses_the_engine_cache_replay():
    w = build("w", mix())
    solo = [j.solo_s for j in engine.solo_replay(w, PROFILE, CFG)]
    assert rate.solo_busy_s(w, PROFILE, CFG) == sum(solo)
    # one request at a time: the engine's own solo_s for a lone request is the same
    first = engine.simulate(build("one", [w.requests[0]]), policies.parse("stock", CFG), PROFILE, CFG)
    assert first.jobs[0].solo_s == solo[0]


def test_future_submissions_arrive_in_time_order_whatever_the_submission_order():
    eng = Engine(policies.parse("stock", CFG), PROFILE, CFG)
    late = eng.submit(Request("late", "t", 10.0, 1000, 1, (1,), (1000,)))
    early = eng.submit(Request("early", "t", 5.0, 1000, 1, (2,), (1000,)))
    eng.advance(7.0)
    assert early.first_token_s > 5.0 and late.first_token_s == -1
    eng.run()
    assert late.first_token_s > 10.0
