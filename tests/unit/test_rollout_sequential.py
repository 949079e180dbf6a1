"""The sequential canary rule: A/A holds, a 2x slower canary is caught, one giant prompt on
the canary does not roll back, missing cells and too few samples are Continue."""

import json
import subprocess
import sys

import yaml

from slipstream.rollout import sequential as sq

RULE = sq.SequentialRule()


def window(k: int, canary: dict, baseline: dict) -> sq.SubWindow:
    return sq.SubWindow(10.0 * k, 10.0 * (k + 1), canary, baseline)


def cells(mean_s: float, n: int = 20, classes: tuple[str, ...] = ("le1k", "le8k")) -> dict:
    return {("chat", c): sq.CellHistogram(n, n * mean_s) for c in classes}


def test_aa_pairs_promote_and_never_roll_back():
    # equal sides within the tolerance: the test crosses to Promote
    windows = [window(k, cells(1.0 + (0.03 if k % 2 else -0.03)), cells(1.0)) for k in range(36)]
    result = sq.evaluate(windows, RULE)
    assert result.outcome == "Promote"
    assert result.llr <= RULE.lower and result.decided_at_s is not None
    assert "Promote" in result.summary and f"{RULE.upper:+.2f}" in result.summary
    # each side slower half the time: never a rollback on the way, Promote at the limit
    coin = [window(k, cells(1.5 if k % 2 else 0.7), cells(1.0)) for k in range(36)]
    assert all(sq.evaluate(coin[:k], RULE).outcome != "Rollback" for k in range(1, 37))
    assert sq.evaluate(coin, RULE, final=True).outcome == "Promote"


def test_a_2x_slower_canary_rolls_back():
    windows = [window(k, cells(2.0), cells(1.0)) for k in range(36)]
    result = sq.evaluate(windows, RULE)
    assert result.outcome == "Rollback"
    assert result.slower == result.observations
    assert result.decided_at_s is not None and result.decided_at_s < 36 * 10


def test_a_lone_giant_prompt_on_the_canary_does_not_roll_back():
    giant = {("chat", "le300k"): sq.CellHistogram(1, 14.0)}
    # the giant's cell (a size class the baseline never saw) and its blocking of every other
    # canary request for two sub-windows
    windows = [window(0, {**cells(8.0), **giant}, cells(1.0)), window(1, cells(6.0), cells(1.0))]
    windows += [window(k, cells(1.0), cells(1.0)) for k in range(2, 36)]
    for k in range(1, len(windows) + 1):
        assert sq.evaluate(windows[:k], RULE).outcome != "Rollback"
    assert sq.evaluate(windows, RULE, final=True).outcome == "Promote"


def test_the_giants_own_cell_never_counts():
    only_giant = window(0, {("chat", "le300k"): sq.CellHistogram(1, 14.0)}, cells(1.0))
    _, counted = sq.pooled_ratio(only_giant, RULE.min_samples)
    assert counted == 0


def test_missing_cells_and_too_few_samples_continue_never_roll_back():
    few = [window(k, cells(10.0, n=RULE.min_samples - 1), cells(1.0)) for k in range(36)]
    other_tenant = [window(k, {("code", "le1k"): sq.CellHistogram(50, 500.0)}, cells(1.0)) for k in range(36)]
    empty = [window(k, {}, {}) for k in range(36)]
    for windows in (few, other_tenant, empty):
        result = sq.evaluate(windows, RULE)
        assert result.outcome == "Continue"
        assert result.observations == 0
    # at the limit, nothing to judge by keeps the running setting
    assert sq.evaluate(empty, RULE, final=True).outcome == "Rollback"
    assert "nothing to judge by" in sq.evaluate(empty, RULE, final=True).summary


def test_truncation_promotes_weak_evidence_and_rolls_back_strong():
    mixed = [window(k, cells(2.0 if k % 2 else 0.5), cells(1.0)) for k in range(4)]
    assert sq.evaluate(mixed, RULE).outcome == "Continue"
    assert sq.evaluate(mixed, RULE, final=True).outcome == "Promote"
    leaning = [window(k, cells(2.0), cells(1.0)) for k in range(4)]
    assert sq.evaluate(leaning, RULE).outcome == "Continue"
    assert sq.evaluate(leaning, RULE, final=True).outcome == "Rollback"


def test_truncation_weighs_few_observations_by_what_they_could_reach():
    # A canary so slow that only one sub-window had enough first tokens on both sides, fully
    # slower: +0.7, under the share of the rollback bound (1.19), yet all the evidence there is.
    starved = [window(0, cells(15.0), cells(1.0))]
    starved += [window(k, cells(15.0, n=RULE.min_samples - 1), cells(1.0)) for k in range(1, 12)]
    result = sq.evaluate(starved, RULE, final=True)
    assert result.observations == 1 and result.llr < RULE.truncation_share * RULE.upper
    assert result.outcome == "Rollback", result.summary
    # One slower sub-window and one no slower is no evidence either way: Promote.
    split = [window(0, cells(15.0), cells(1.0)), window(1, cells(1.0), cells(1.0))]
    assert sq.evaluate(split, RULE, final=True).outcome == "Promote"


def test_a_starved_canary_rolls_back_at_the_limit():
    # CI's closed-loop test: a 20x slower canary scored slower in 2 of 3 sub-windows and
    # faster in one (its means are over the few requests it got through): +0.70, promoted.
    # Its pod gave a fraction of the baseline pod's first tokens over the analysis.
    starved = [window(0, cells(15.0, n=6), cells(1.0)), window(1, cells(15.0, n=6), cells(1.0)),
               window(2, cells(0.5, n=6), cells(1.0))]  # fmt: skip
    starved += [window(k, {}, cells(1.0)) for k in range(3, 6)]
    assert sq.evaluate(starved, RULE, final=True).outcome == "Promote"  # without pod counts, as before
    result = sq.evaluate(starved, RULE, final=True, pods=(1, 1))
    assert result.outcome == "Rollback" and "starved" in result.summary, result.summary
    assert sq.evaluate(starved, RULE, final=False, pods=(1, 1)).outcome == "Continue"  # only at the limit
    # The same counts over six baseline pods: 36 first tokens against 40 per pod, not starved.
    assert sq.evaluate(starved, RULE, final=True, pods=(1, 6)).outcome == "Promote"
    # A canary that keeps up, however slow its means, gives as many first tokens: not starved.
    keeping = [window(0, cells(15.0), cells(1.0)), window(1, cells(1.0), cells(1.0))]
    assert sq.evaluate(keeping, RULE, final=True, pods=(1, 1)).outcome == "Promote"
    # Too few baseline first tokens to tell: the clause says nothing.
    few = [window(0, cells(15.0, n=1), cells(1.0, n=4)), window(1, {}, cells(1.0, n=4))]
    assert sq.starved(few, (1, 1), RULE) is None


def small_spec(tmp_path) -> str:
    doc = {
        "name": "small", "profile": "kimi-k3-8xh200", "seed": 3, "duration_s": 200,
        "engine": {"chunked_prefill_size": 8192, "page_size": 1, "cache_tokens": 3_000_000},
        "tenants": [{"name": "chat", "rate_per_s": 3.0,
                     "prompt_tokens": {"dist": "lognormal", "median": 2000, "sigma": 0.3, "min": 500, "max": 6000},
                     "output_tokens": {"dist": "lognormal", "median": 20, "sigma": 0.5, "min": 1, "max": 100}}],
    }
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_canary_check_json_on_a_small_workload(tmp_path):
    cmd = [sys.executable, "-m", "slipstream.cli", "canary-check", "--workload", small_spec(tmp_path),
           "--pairs", "4", "--analysis-window", "40", "--limit", "120", "--json"]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    assert out["pairs"] == 4 and out["slow_factor"] == 2.0
    assert len(out["pairs_detail"]["aa"]) == 4 and len(out["pairs_detail"]["slow"]) == 4
    assert out["false_rollback_rate"] == sum(r["outcome"] == "Rollback" for r in out["pairs_detail"]["aa"]) / 4
    assert out["detection_rate"] == 1.0  # a 2x slower engine on steady traffic is caught every time
    assert out["false_rollback_rate"] == 0.0
    assert all(40 <= r["decided_after_s"] <= 120 for rows in out["pairs_detail"].values() for r in rows)


def test_canary_check_refuses_a_workload_too_short(tmp_path):
    cmd = [sys.executable, "-m", "slipstream.cli", "canary-check", "--workload", small_spec(tmp_path),
           "--limit", "360"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode != 0
    assert "warmup + limit" in run.stderr


def test_canary_check_candidate_pairs_promote_a_setting_that_is_no_worse(tmp_path):
    """--candidate runs a third kind of pair, the canary on another setting than the
    baseline: on steady uniform traffic a 4096 ceiling changes nothing, so it is promoted."""
    cmd = [sys.executable, "-m", "slipstream.cli", "canary-check", "--workload", small_spec(tmp_path),
           "--pairs", "3", "--analysis-window", "40", "--limit", "120", "--candidate", "ceiling:8192", "--json"]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    rows = out["pairs_detail"]["candidate"]
    assert len(rows) == 3 and out["candidate"] == "ceiling:8192"
    assert out["candidate_promote_rate"] == sum(r["outcome"] == "Promote" for r in rows) / 3 == 1.0
    assert set(out["mean_decision_s"]) == {"aa", "slow", "candidate"}


def test_canary_check_refuses_an_unknown_candidate(tmp_path):
    cmd = [sys.executable, "-m", "slipstream.cli", "canary-check", "--workload", small_spec(tmp_path),
           "--candidate", "nonsense:1"]
    run = subprocess.run(cmd, capture_output=True, text=True)
    assert run.returncode != 0 and "nonsense" in run.stderr
