"""The releases Slipstream has a patch for: what each offers, what the spec may ask of it,
and which reported versions hold Auto to recommending (issue 19 item 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pydantic
import pytest

from slipstream.api import models, versions
from slipstream.engine import admin
from slipstream.tune import candidates

ROOT = Path(__file__).resolve().parents[2]


def spec(**engine: Any) -> dict[str, Any]:
    tuning = engine.pop("tuning", {"mode": "Fixed", "threshold": 0})
    return {"engine": {"image": "i", "model": "m", **engine}, "tuning": tuning}


def test_every_patched_release_has_a_patch_file_and_a_test_environment() -> None:
    assert set(get_args(models.EngineVersion)) == set(versions.SUPPORTED)
    for release in versions.SUPPORTED:
        assert (ROOT / "engine_image" / "patches" / f"sglang-{release}-long-prefill.patch").is_file()
    assert versions.NEWEST == "0.5.23"
    assert models.EngineSpec.model_validate({"image": "i", "model": "m"}).version == versions.NEWEST
    assert set(get_args(models.SchedulePolicy)) == set(versions.PATCHED[versions.NEWEST])


def test_the_spec_offers_0_5_23_orders_only_to_0_5_23() -> None:
    for order in ("hrrn", "shortest-prefill-first"):
        ok = models.ServingDeploymentSpec.model_validate(spec(tuning={"mode": "Fixed", "threshold": 0,
                                                                      "schedulePolicy": order}))
        assert ok.tuning.schedule_policy == order
        with pytest.raises(pydantic.ValidationError, match="SGLang 0.5.23's orders"):
            models.ServingDeploymentSpec.model_validate(spec(version="0.5.18", tuning={
                "mode": "Fixed", "threshold": 0, "schedulePolicy": order}))
    with pytest.raises(pydantic.ValidationError, match="version"):
        models.EngineSpec.model_validate({"image": "i", "model": "m", "version": "0.5.24"})


def test_the_tuner_tries_only_the_orders_of_the_release() -> None:
    every_order = ["fcfs", "lpm", "srpt", "hrrn", "shortest-prefill-first"]
    default = candidates.from_spec(models.ServingDeploymentSpec.model_validate(spec()))
    assert default.orders == ("fcfs", "lpm", "srpt"), "0.5.23's own orders are opt-in (spec.tuning.orders)"
    old = candidates.from_spec(models.ServingDeploymentSpec.model_validate(spec(version="0.5.18")))
    new = candidates.from_spec(models.ServingDeploymentSpec.model_validate(spec(tuning={
        "mode": "Fixed", "threshold": 0, "orders": every_order})))
    assert old.orders == ("fcfs", "lpm", "srpt")
    assert new.orders == ("fcfs", "lpm", "srpt", "hrrn", "spf")
    with pytest.raises(pydantic.ValidationError, match="spec.tuning.orders: hrrn and shortest-prefill-first"):
        models.ServingDeploymentSpec.model_validate(spec(version="0.5.18", tuning={
            "mode": "Fixed", "threshold": 0, "orders": every_order}))
    every = ("fcfs", "lpm", "srpt", "spf", "hrrn")
    assert {s.order for s in candidates.enumerate_candidates(old, every)} == {"fcfs", "lpm", "srpt"}
    assert {s.order for s in candidates.enumerate_candidates(new, every)} == set(every)
    spf = candidates.Setting(0, "ceiling", "shortest-prefill-first")
    assert spf.order == "spf", "SGLang's name is kept by the twin's"
    assert new.allows(spf) and not old.allows(spf)


@pytest.mark.parametrize(("reported", "expected"), [
    ([("a", "0.5.23"), ("b", "0.5.23+slipstream-engine-sim")], None),
    ([("a", "0.5.23"), ("b", "")], None),
    ([("a", "v0.5.23")], None),
    ([], None),
    ([("a", "0.5.23"), ("b", "0.5.24")], "UnpatchedVersion"),
    ([("a", "0.5.18")], "VersionMismatch"),
    ([("a", "0.5.18"), ("b", "0.6.0")], "UnpatchedVersion"),
])  # fmt: skip
def test_which_reported_versions_may_be_tuned(reported: list[tuple[str, str]], expected: str | None) -> None:
    problem = versions.problem("0.5.23", reported)
    assert (problem[0] if problem else None) == expected
    if problem is not None:
        bad = [pod for pod, v in reported if v and versions.release(v) != "0.5.23"]
        assert all(pod in problem[1] for pod in bad), problem[1]
        assert "Auto only recommends" in problem[1]


def test_the_admin_client_reads_the_version_sglang_reports() -> None:
    assert admin.version_of({"version": " 0.5.23 "}) == "0.5.23"
    assert admin.version_of({"version": 5}) == ""
    assert admin.version_of({}) == ""
    assert len(admin.version_of({"version": "9" * 500})) == 64
