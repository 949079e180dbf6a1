"""What keeps the operator's memory bounded and its loops on time at 500 deployments
(docs/reliability.md, "Scale"): the tuner's twin runs go to a pool of their own, sized to the
CPUs the process may use, never to the 32 I/O worker threads; a reused recommendation never
waits for that pool; and a fleet read keeps its assembled snapshots, not its samples.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterator

import prometheus_client
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_tune import heterogeneous
from test_tune_memo import scaled

from slipstream.api import models
from slipstream.api import snapshot as snap
from slipstream.controller import loop, stages, tuning
from slipstream.controller import settings as settings_
from slipstream.observe import assemble, fleet, parse
from slipstream.observe.observer import FleetRead

NOW = 1_800_000_000.0


# -- the tuner's threads ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("affinity", "cpu_max", "cpus"),
    [
        (8, "150000 100000\n", 2),  # a 1.5-CPU limit: 2 (rounded up)
        (8, "100000 100000", 1),  # the chart's limit of 1 CPU
        (2, "800000 100000", 2),  # a quota above the cores: the cores
        (8, "max 100000", 8),  # no quota
        (8, None, 8),  # no cgroup v2 file
        (8, "lots of cpu", 8),  # unreadable: the affinity alone
        (0, "0 100000", 1),  # never below one
    ],
)
def test_usable_cpus_are_the_affinity_cut_to_the_cgroup_quota(affinity: int, cpu_max: str | None, cpus: int) -> None:
    assert settings_.usable_cpus(affinity, cpu_max) == cpus


def test_tuner_threads_default_to_the_cpus_at_most_four_and_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    auto = settings_.ControllerSettings().tuner_concurrency()
    assert 1 <= auto <= 4
    monkeypatch.setenv("SLIPSTREAM_TUNER_THREADS", "3")
    config = settings_.ControllerSettings.from_env()
    assert (config.tuner_threads, config.tuner_concurrency()) == (3, 3)


class CountingRecommender:
    """Records on which threads, and how many at once, the loop runs the recommender."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside = 0
        self.most = 0
        self.threads: set[str] = set()

    def without_twin(self, sd: models.ServingDeployment, s: snap.WorkloadSnapshot,
                     fleet_setting: models.EngineSetting, now: float, jumped: bool = False,
                     ) -> tuning.Recommendation | None:  # fmt: skip
        return None  # every call is a twin run

    def recommend(self, sd: models.ServingDeployment, s: snap.WorkloadSnapshot, fleet_setting: models.EngineSetting,
                  now: float, jumped: bool = False) -> tuning.Recommendation:  # fmt: skip
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
            self.threads.add(threading.current_thread().name)
        # CPU-bound work under the GIL, as the twin's: the other callers get their turns.
        sum(i * i for i in range(300_000))  # ~20 ms: past the GIL switch interval (5 ms)
        with self.lock:
            self.inside -= 1
        return tuning.Recommendation(fleet_setting, False, f"held for {sd.metadata.name}")


class ValidSnapshots:
    async def snapshot(self, sd: models.ServingDeployment, window_s: float, now: float,
                       min_samples: int | None = None) -> snap.WorkloadSnapshot:
        name = f"{sd.metadata.namespace}/{sd.metadata.name}"
        return snap.WorkloadSnapshot(name, now, window_s)


def deployment(name: str) -> models.ServingDeployment:
    return models.ServingDeployment.model_validate({
        "metadata": {"name": name, "namespace": "prod", "uid": name, "generation": 1},
        "spec": {"replicas": 1, "engine": {"image": "i", "model": "m", "chunkedPrefillSize": 8192, "pageSize": 64},
                 "tuning": {"mode": "Recommend", "threshold": 4096}, "prometheus": {"url": "http://127.0.0.1:9"}},
        "status": {"observedGeneration": 1},
    })  # fmt: skip


def test_the_loops_run_the_recommender_on_the_tuner_pool_only_as_many_at_once_as_it_has_threads() -> None:
    recommender = CountingRecommender()
    pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="slipstream-tuner")
    deps = loop.Deps(kube=None, config=settings_.ControllerSettings(), keys=None,  # type: ignore[arg-type]
                     observer=ValidSnapshots(), recommender=recommender, tuner=pool)  # fmt: skip

    async def every_loop() -> list[tuple[snap.WorkloadSnapshot | None, tuning.Recommendation | None]]:
        # 32 worker threads, as the operator configures: before, each loop's run took one.
        asyncio.get_running_loop().set_default_executor(concurrent.futures.ThreadPoolExecutor(32))
        return await asyncio.gather(*(loop.observe(deps, deployment(f"sd-{i}"), models.EngineSetting(threshold=4096),
                                                   NOW) for i in range(24)))  # fmt: skip

    try:
        out = asyncio.run(every_loop())
    finally:
        pool.shutdown()
    assert [rec.reason for _, rec in out if rec is not None] == [f"held for sd-{i}" for i in range(24)]
    assert recommender.most <= 2, f"{recommender.most} runs at once on a pool of 2"
    assert recommender.threads and all(t.startswith("slipstream-tuner") for t in recommender.threads), recommender.threads


# -- a reused recommendation does not wait for the tuner pool -----------------------------------


class Twin:
    """The real twin (`tune.recommend.recommend`), recording each run's deployment and thread;
    the run of deployment ``slow`` blocks until ``release`` (a pool kept busy)."""

    def __init__(self, slow: str) -> None:
        self.slow = slow
        self.entered = threading.Event()
        self.release = threading.Event()
        self.runs: list[tuple[str, str]] = []


@pytest.fixture
def twin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Twin]:
    from slipstream.tune import recommend

    real = recommend.recommend
    fake = Twin(slow="prod/a")

    def run(snapshot: snap.WorkloadSnapshot, *args, **kwargs):  # type: ignore[no-untyped-def]
        fake.runs.append((snapshot.deployment, threading.current_thread().name))
        if snapshot.deployment == fake.slow:
            fake.entered.set()
            assert fake.release.wait(30), "the slow twin run was never released"
        return real(snapshot, *args, **kwargs)

    monkeypatch.setattr(recommend, "recommend", run)
    yield fake
    fake.release.set()  # never leave a pool thread blocked (the interpreter joins it at exit)


class Snapshots:
    """Each deployment's snapshot for this interval, as observe hands it over."""

    def __init__(self, snaps: dict[str, snap.WorkloadSnapshot]) -> None:
        self.snaps = snaps

    async def snapshot(self, sd: models.ServingDeployment, window_s: float, now: float,
                       min_samples: int | None = None) -> snap.WorkloadSnapshot:
        return self.snaps[f"{sd.metadata.namespace}/{sd.metadata.name}"]


class Pool(concurrent.futures.ThreadPoolExecutor):
    """The tuner pool, counting what the loops send it."""

    def __init__(self, threads: int) -> None:
        super().__init__(threads, thread_name_prefix="slipstream-tuner")
        self.submitted = 0

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


async def until(condition: Callable[[], bool], what: str, deadline_s: float = 20.0) -> None:
    """Poll ``condition`` on the event loop until it holds; fail after ``deadline_s``."""
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, f"{what}: not within {deadline_s} s"
        await asyncio.sleep(0.01)


CONFIG = settings_.ControllerSettings(observe_min_samples=50)
FLEET = models.EngineSetting(threshold=4096)


def mix(name: str, rate_factor: float = 1.0) -> snap.WorkloadSnapshot:
    """The heterogeneous test mix as deployment ``name``'s snapshot (rates scaled)."""
    return dataclasses.replace(scaled(heterogeneous(), rate_factor), deployment=name)


def counted(name: str) -> float:
    return prometheus_client.REGISTRY.get_sample_value(name) or 0.0


def fresh(sd: models.ServingDeployment, s: snap.WorkloadSnapshot, now: float) -> tuning.Recommendation:
    """The recommendation computed with no memo at all (twin run every time, as before)."""
    no_memo = stages.TwinRecommender(dataclasses.replace(CONFIG, tuner_reuse_seconds=0))
    assert no_memo.memo is None
    return no_memo.recommend(sd, s, FLEET, now)


def test_an_unmoved_workload_gets_its_reused_recommendation_while_the_tuner_pool_is_busy(twin: Twin) -> None:
    pool = Pool(1)
    observer = Snapshots({"prod/a": mix("prod/a"), "prod/b": mix("prod/b")})
    deps = loop.Deps(kube=None, config=CONFIG, keys=None,  # type: ignore[arg-type]
                     observer=observer, recommender=stages.TwinRecommender(CONFIG), tuner=pool)  # fmt: skip
    runs0, reuses0 = counted("slipstream_tuner_seconds_count"), counted("slipstream_tuner_reuses_total")

    async def loops() -> tuple[tuning.Recommendation | None, tuning.Recommendation | None, bool]:
        _, first = await loop.observe(deps, deployment("b"), FLEET, NOW)  # b's twin run
        a = asyncio.ensure_future(loop.observe(deps, deployment("a"), FLEET, NOW))
        assert await asyncio.to_thread(twin.entered.wait, 30), "a's twin run never started"
        try:  # the pool's only thread is blocked in a's twin run: b's next interval must not wait
            _, again = await asyncio.wait_for(loop.observe(deps, deployment("b"), FLEET, NOW + 60), timeout=20)
            busy = not a.done() and not twin.release.is_set()
        finally:
            twin.release.set()
        await a
        return first, again, busy

    try:
        first, again, busy = asyncio.run(loops())
    finally:
        pool.shutdown()
    assert busy, "b's reused recommendation came only after the pool was free"
    assert pool.submitted == 2, "b's reuse was sent to the tuner pool"
    assert [d for d, _ in twin.runs] == ["prod/b", "prod/a"], "b's workload did not move: no second twin run"
    assert all(t.startswith("slipstream-tuner") for _, t in twin.runs), twin.runs
    # slipstream_tuner_seconds counts twin runs only; the reuse has its own counter
    assert counted("slipstream_tuner_seconds_count") - runs0 == 2
    assert counted("slipstream_tuner_reuses_total") - reuses0 == 1
    assert again is not None and again == first
    # the same as computing it afresh for the same inputs (no memo, the twin run again)
    assert again == fresh(deployment("b"), mix("prod/b"), NOW + 60)


def test_a_moved_workload_still_waits_for_the_tuner_pool_and_gets_a_fresh_recommendation(twin: Twin) -> None:
    pool = Pool(1)
    observer = Snapshots({"prod/a": mix("prod/a"), "prod/b": mix("prod/b")})
    deps = loop.Deps(kube=None, config=CONFIG, keys=None,  # type: ignore[arg-type]
                     observer=observer, recommender=stages.TwinRecommender(CONFIG), tuner=pool)  # fmt: skip

    async def loops() -> tuple[tuning.Recommendation | None, bool]:
        await loop.observe(deps, deployment("b"), FLEET, NOW)
        a = asyncio.ensure_future(loop.observe(deps, deployment("a"), FLEET, NOW))
        assert await asyncio.to_thread(twin.entered.wait, 30), "a's twin run never started"
        observer.snaps["prod/b"] = mix("prod/b", 1.5)  # b's traffic +50%: beyond the noise
        b = asyncio.ensure_future(loop.observe(deps, deployment("b"), FLEET, NOW + 60))
        try:
            await until(lambda: pool.submitted == 3, "b's twin run sent to the tuner pool")
            waiting = not b.done()
        finally:
            twin.release.set()
        await a
        _, moved = await b
        return moved, waiting

    try:
        moved, waiting = asyncio.run(loops())
    finally:
        pool.shutdown()
    assert waiting, "b's moved workload was answered before the pool was free"
    # b's second run queued behind a's on the pool's one thread, as every twin run does
    assert [d for d, _ in twin.runs] == ["prod/b", "prod/a", "prod/b"], twin.runs
    assert all(t.startswith("slipstream-tuner") for _, t in twin.runs), twin.runs
    # the same recommendation as computed afresh (no memo: the code before the split)
    assert moved is not None and moved == fresh(deployment("b"), mix("prod/b", 1.5), NOW + 60)


# -- the fleet read keeps snapshots, not samples ----------------------------------------------


def sample(value: float, dep: str, **labels: str) -> parse.Sample:
    return parse.Sample({"namespace": "ns", "servingdeployment": dep, **labels}, value, NOW)


def answers(deps: list[str]) -> dict[str, list[parse.Sample]]:
    out: dict[str, list[parse.Sample]] = {f: [] for f in ("ttft", "uncached", "output", "tokens", "queue", "settings",
                                                         "targets")}  # fmt: skip
    for dep in deps:
        for le, v in (("0.5", 80.0), ("2", 99.0), ("+Inf", 100.0)):
            out["ttft"].append(sample(v, dep, tenant="acme", le=le, part="bucket"))
        out["ttft"].append(sample(60.0, dep, tenant="acme", part="sum"))
        out["uncached"] += [sample(100.0, dep, tenant="acme", le="2000", part="bucket"),
                            sample(100.0, dep, tenant="acme", le="+Inf", part="bucket"),
                            sample(1e5, dep, tenant="acme", part="sum")]  # fmt: skip
        out["queue"] += [sample(1.0, dep, part="depth"), sample(NOW - 1, dep, part="newest")]
        out["targets"].append(sample(1.0, dep, pod=f"{dep}-0", part="up"))
    return out


class AnsweringObserver:
    """observe's Observer as `fleet.fetch` uses it: one read of fixed answers."""

    def __init__(self, results: dict[str, list[parse.Sample]] | None) -> None:
        self.results = results

    def fetch(self, at: float | None = None) -> FleetRead:
        rules = assemble.Rules(window_s=60.0, min_samples=10, max_staleness_s=10.0)
        if self.results is None:
            return FleetRead(NOW, rules, "tenant", None, "refused")
        reduced = {field: assemble.reduce(field, samples) for field, samples in self.results.items()}
        return FleetRead(NOW, rules, "tenant", reduced, "")


def test_a_kept_fleet_read_holds_every_snapshot_but_none_of_its_samples() -> None:
    full = AnsweringObserver(answers(["a", "b"]))
    whole = full.fetch()
    kept = fleet.fetch(full, NOW)  # type: ignore[arg-type]
    assert kept.read.results is not None and not any(kept.read.results["ttft"]), "answers dropped"
    assert kept.read.results.keys() == whole.results.keys()  # type: ignore[union-attr]
    assert kept.snapshots == whole.snapshots() and set(kept.snapshots) == {"ns/a", "ns/b"}
    assert kept.get("ns/a").valid, kept.get("ns/a").detail
    # A deployment no answer mentions gets what the full answers say about it.
    assert kept.get("ns/ghost") == whole.snapshots(["ns/ghost"])["ns/ghost"]
    assert kept.get("ns/ghost").invalid == snap.NO_SERIES
    # A failed read stays a failure for everyone, with its reason.
    failed = fleet.fetch(AnsweringObserver(None), NOW)  # type: ignore[arg-type]
    assert failed.read.results is None and failed.get("ns/a").invalid == snap.UNREACHABLE
    assert "refused" in failed.get("ns/a").detail


# -- a fleet read's answers, decoded and reduced as they come --------------------------------


def _same(a: list[parse.Sample] | str, b: list[parse.Sample] | str) -> bool:
    """Equal samples (NaN equal to NaN), or the same refusal."""
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return [(s.labels, repr(s.value), s.timestamp) for s in a] == [(s.labels, repr(s.value), s.timestamp) for s in b]


def _parsed(text: str, **hook: object) -> list[parse.Sample] | str:
    try:
        return parse.vector(json.loads(text, **hook))  # type: ignore[arg-type]
    except parse.MalformedAnswer:
        return "refused"


_label = st.sampled_from(["ns", "sd-1", "chat", "bucket", "+Inf", "", "le"])
_value = st.one_of(st.sampled_from(["1.5", "NaN", "+Inf", "-Inf", "x", ""]), st.integers(), st.none())
_series = st.fixed_dictionaries(
    {"value": st.one_of(st.tuples(st.floats(allow_nan=True) | st.text(max_size=2), _value).map(list),
                        st.lists(st.floats(allow_nan=True) | _value, max_size=3))},
    optional={"metric": st.one_of(st.dictionaries(_label, _label | st.integers(), max_size=4), st.integers()),
              "extra": st.integers()},
)
_answer = st.one_of(st.lists(st.one_of(_series, st.integers(), st.dictionaries(_label, _label, max_size=3)), max_size=6),
                    st.dictionaries(_label, _label, max_size=3), st.integers())


@settings(max_examples=400, deadline=None, derandomize=True)
@given(_answer)
@example([{"metric": {"a": "b"}, "value": [1.0, "1", 2]}])  # three values: refused
@example([{"metric": {"a": 1}, "value": [1.0, "1"]}])  # a label that is not a string
@example([{"value": [1.0, "2"]}])  # no labels: a sample without any
@example([{"metric": {}, "value": [1e308 * 10, "1"]}])  # an infinite timestamp
def test_decoding_straight_into_samples_is_the_same_parse_as_decoding_then_parsing(answer: object) -> None:
    """`parse.series_hook` (the client's decoding) gives what `parse.vector` of the plainly
    decoded answer gives: the same samples, or a refusal."""
    text = json.dumps(answer)
    assert _same(_parsed(text, object_hook=parse.series_hook), _parsed(text))


def test_decoded_series_share_their_label_strings() -> None:
    """The 120 series of one deployment hold one copy of its name, not 120."""
    rows = [{"metric": {"namespace": "team-a", "servingdeployment": "chat-" + "x" * 40, "le": str(le)},
             "value": [NOW, "1"]} for le in range(3)]  # fmt: skip
    a, b, c = parse.vector(json.loads(json.dumps(rows), object_hook=parse.series_hook))
    assert a.labels["servingdeployment"] is b.labels["servingdeployment"] is c.labels["servingdeployment"]
    plain = parse.vector(json.loads(json.dumps(rows)))
    assert plain[0].labels["servingdeployment"] is not plain[1].labels["servingdeployment"]  # what it saves


def test_reducing_each_answer_as_it_comes_gives_the_same_snapshots() -> None:
    rules = assemble.Rules(window_s=60.0, min_samples=10, max_staleness_s=10.0)
    results = answers(["a", "b"])
    reduced = {field: assemble.reduce(field, samples) for field, samples in results.items()}
    whole = assemble.snapshots(results, now=NOW, rules=rules)
    assert assemble.combine(reduced, now=NOW, rules=rules) == whole and whole["ns/a"].valid
    with pytest.raises(ValueError, match="unknown fleet query 'ttft2'"):
        assemble.reduce("ttft2", [])
