"""The tuner runs its candidates with the engines' own KV pool (issue 19's tight pool).

Under a tight pool the partials' KV reservation makes ceiling mode admit long prompts one
after another at T tokens a pass (45 prefill passes against floor's 12 on three 30,000-token
prompts in a 40,000-token pool, `tests/engine/test_issue19.py`); a profile's pool of
millions of tokens hides that. The pool each pod reports (`max_total_num_tokens` in
/get_server_info) is read by the loop (`engine.admin.kv_pool_of`, `controller.tuning.kv_pools`),
carried in the snapshot (`WorkloadSnapshot.kv_pools`) and the smallest runs the twin
(`tune.deployment.twin_pool`); a missing or garbled value never becomes a size."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
from test_tune import PROFILE, observed_under, snapshot, tenant

from slipstream.api import models
from slipstream.api.snapshot import PodPool, WorkloadSnapshot
from slipstream.controller import settings as settings_
from slipstream.controller import stages, tuning
from slipstream.engine import admin
from slipstream.rollout import machine
from slipstream.tune import codec, deployment

OFF = models.EngineSetting(threshold=0)
TIGHT = 40_000
"""The engine test's pool: three 30,000-token prompts fit one at a time."""


def sd() -> models.ServingDeployment:
    return models.ServingDeployment.model_validate({
        "metadata": {"name": "kimi", "namespace": "prod", "uid": "u", "generation": 1},
        "spec": {"replicas": 1, "engine": {"image": "i", "model": "m", "chunkedPrefillSize": 8192},
                 "tuning": {"mode": "Auto", "threshold": 0}, "prometheus": {"url": "http://127.0.0.1:9090"}},
    })  # fmt: skip


def documents() -> WorkloadSnapshot:
    """Chat beside a steady stream of 24K-32K-token documents (about 30% of the prefill
    time), as engines running off/fcfs report it: long prompts overlap often enough that
    several partials would run at once, if the pool let them."""
    rng = random.Random(5)
    return observed_under(snapshot(
        tenant("chat", 2.0, [float(rng.randint(1000, 3000)) for _ in range(600)]),
        tenant("docs", 0.3, [float(rng.randint(24000, 32000)) for _ in range(90)]),
    ))


# -- what an engine's answer says ----------------------------------------------------------


@pytest.mark.parametrize("info, pool", [
    ({"max_total_num_tokens": 40000}, 40000),
    ({"max_total_num_tokens": 40000.0}, 40000),  # a JSON number with a decimal point
    ({"max_total_num_tokens": 1_834_567, "max_total_tokens": None}, 1_834_567),
])  # fmt: skip
def test_an_engines_pool_is_read_from_its_server_info(info: dict[str, object], pool: int) -> None:
    assert admin.kv_pool_of(info) == (pool, "")


@pytest.mark.parametrize("value", [None, "40000", "abc", True, 0, -5, 40000.5, math.nan, math.inf, 1e30, [40000],
                                   {"tokens": 40000}])  # fmt: skip
def test_a_missing_or_garbled_pool_is_no_size_and_says_why(value: object) -> None:
    got, problem = admin.kv_pool_of({"max_total_num_tokens": value})
    assert got is None and "max_total_num_tokens" in problem
    assert admin.kv_pool_of({}) == (None, "no max_total_num_tokens in its server info")


# -- the rule: the smallest reported, else the profile's -------------------------------------


def test_the_twin_runs_with_the_smallest_pool_reported() -> None:
    pools = (PodPool("a", 1_800_000), PodPool("b", TIGHT), PodPool("c", 90_000))
    assert deployment.twin_pool(pools) == deployment.TwinPool(TIGHT, "")
    assert deployment.engine_config(sd().spec, pools).kv_pool_tokens == TIGHT


def test_no_usable_pool_falls_back_to_the_profiles_and_says_so() -> None:
    none = deployment.twin_pool(())
    assert none.tokens is None and "the profile's" in none.note and "no engine pod has reported" in none.note
    garbled = deployment.twin_pool((PodPool("a", None, "max_total_num_tokens is 'abc', not a token count"),))
    assert garbled.tokens is None
    assert garbled.note == "twin KV pool: the profile's (a: max_total_num_tokens is 'abc', not a token count)"
    assert deployment.engine_config(sd().spec, (PodPool("a", None, "x"),)).kv_pool_tokens is None
    # One pod garbled beside one that reports: the reported pool, and the other pod named.
    mixed = deployment.twin_pool((PodPool("a", None, "no max_total_num_tokens in its server info"),
                                  PodPool("b", TIGHT)))  # fmt: skip
    assert mixed.tokens == TIGHT and "a: no max_total_num_tokens" in mixed.note
    many = deployment.twin_pool(tuple(PodPool(f"p{k}", None, "bad") for k in range(5)))
    assert many.note.endswith("p2: bad and 2 more)")


def test_a_missing_or_garbled_answer_keeps_the_pool_the_pod_reported_before() -> None:
    read = tuning.kv_pools((), [machine.Pod("a", OFF, kv_pool_tokens=TIGHT), machine.Pod("b", OFF, kv_pool_tokens=90_000)])
    assert read == (PodPool("a", TIGHT), PodPool("b", 90_000))
    # a: an answer with no usable pool; b: its read failed; c: a new pod with a garbled one.
    later = tuning.kv_pools(read, [machine.Pod("a", OFF, kv_pool_problem="max_total_num_tokens is 'abc', not a token count"),
                                   machine.Pod("b", None, "reading its setting failed: timed out"),
                                   machine.Pod("c", OFF, kv_pool_problem="no max_total_num_tokens in its server info")])  # fmt: skip
    assert later == (PodPool("a", TIGHT, "max_total_num_tokens is 'abc', not a token count"),
                     PodPool("b", 90_000), PodPool("c", None, "no max_total_num_tokens in its server info"))  # fmt: skip
    assert deployment.twin_pool(later).tokens == TIGHT
    # A pod that is gone is forgotten.
    assert tuning.kv_pools(later, [machine.Pod("c", OFF, kv_pool_tokens=90_000)]) == (PodPool("c", 90_000),)


def test_the_snapshot_codec_keeps_the_pools() -> None:
    snap = replace(snapshot(tenant("chat", 1.0, [2000.0] * 10)),
                   kv_pools=(PodPool("a", TIGHT), PodPool("b", None, "no max_total_num_tokens in its server info")))
    assert codec.from_dict(codec.to_dict(snap)) == snap
    bad = codec.to_dict(snap)
    bad["kv_pools"][0]["tokens"] = "40000"
    with pytest.raises(ValueError, match=r"kv_pools\[0\]\.tokens"):
        codec.from_dict(bad)


# -- the choice ---------------------------------------------------------------------------


def test_a_tight_pool_steers_the_tuner_off_ceiling() -> None:
    """The same window: ceiling with the profile's pool (1.8M tokens), not ceiling with the
    40,000-token pool the engines report (floor, which a lone partial expands in)."""
    assert PROFILE.kv_pool_tokens is not None and PROFILE.kv_pool_tokens > 1_000_000
    config = settings_.ControllerSettings(observe_min_samples=50)
    window = documents()
    roomy = stages.TwinRecommender(config).recommend(sd(), window, OFF, 1000.0)
    assert roomy.setting.threshold > 0 and roomy.setting.mode == "ceiling", roomy
    assert "twin KV pool: the profile's (no engine pod has reported" in roomy.reason
    recommender = stages.TwinRecommender(config)
    tight = recommender.recommend(sd(), replace(window, kv_pools=(PodPool("kimi-0", TIGHT),)), OFF, 1000.0)
    assert tight.setting.mode == "floor" or tight.setting.threshold == 0, tight
    assert "twin KV pool" not in tight.reason
    # The twin ran with the engines' pool (the memo keys each run by its engine config).
    assert recommender.memo is not None
    (entry,) = recommender.memo.entries.values()
    assert entry.key[-1].kv_pool_tokens == TIGHT
