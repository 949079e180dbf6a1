"""Per-round prefill allocations of the patched scheduler, against stock sglang 0.5.18."""

from __future__ import annotations

import harness as h

C = 8192
THREE_LONG = {"requests": [{"rid": f"L{i}", "need": 500_000} for i in range(3)], "rounds": 3}

# seeds/000: a 600K cold prompt first, then four small prompts and two 300K prompts at
# 99% prefix-cache hit (297K cached, 3K fresh).
SEED_000 = {
    "shared_prefix": 297_000,
    "warm_prefix": True,
    "requests": (
        [{"rid": "cold", "need": 600_000}]
        + [{"rid": f"small{i}", "need": 2_000} for i in range(4)]
        + [{"rid": f"hit{i}", "need": 3_000, "cached": True} for i in range(2)]
    ),
    "rounds": 4,
}


def case(base, **engine):
    return {**base, "engine": {"chunked_prefill_size": C, **engine}}


def test_harness_runs_the_patched_code():
    assert h.PATCHED, "the patched sglang copy must come first on sys.path"


def test_three_long_requests_stock_and_ceiling(pristine):
    stock = pristine({"c": case(THREE_LONG)})
    assert stock["_patched"] is False
    assert [[r.get(f"L{i}", 0) for i in range(3)] for r in stock["c"]] == [[8192, 0, 0]] * 3
    patched_off = h.run_case(case(THREE_LONG))
    assert patched_off == stock["c"]
    ceiling = h.run_case(case(THREE_LONG, threshold=4096))
    assert [[r.get(f"L{i}", 0) for i in range(3)] for r in ceiling] == [[4096, 4096, 0]] * 3


def test_floor_lone_long_request_uses_the_whole_budget():
    rounds = h.run_case(
        {
            "requests": [{"rid": "L", "need": 500_000}],
            "rounds": 3,
            "engine": {"chunked_prefill_size": C, "threshold": 4096, "mode": "floor"},
        }
    )
    assert rounds == [{"L": 8192}] * 3


def test_floor_two_long_requests_split_evenly():
    rounds = h.run_case(
        {
            "requests": [{"rid": "A", "need": 500_000}, {"rid": "B", "need": 500_000}],
            "rounds": 3,
            "engine": {"chunked_prefill_size": C, "threshold": 4096, "mode": "floor"},
        }
    )
    assert rounds == [{"A": 4096, "B": 4096}] * 3


def test_ceiling_lone_long_request_is_capped():
    rounds = h.run_case(
        {
            "requests": [{"rid": "L", "need": 500_000}],
            "rounds": 2,
            "engine": {"chunked_prefill_size": C, "threshold": 4096},
        }
    )
    assert rounds == [{"L": 4096}] * 2


def test_seed_000_mix_round_by_round(pristine):
    stock = pristine({"seed": case(SEED_000)})["seed"]
    # Stock: the cold prompt holds the whole budget; everyone else waits behind it.
    assert stock == [{"cold": 8192}] * 4
    assert h.run_case(case(SEED_000)) == stock
    ceiling = h.run_case(case(SEED_000, threshold=2048))
    # T = 2048: the cold prompt takes 2048, the small prompts and the cache hits
    # (3,000 fresh tokens each: longer than T, so capped) share the rest.
    assert ceiling[0] == {
        "cold": 2048,
        "small0": 2000,
        "small1": 2000,
        "small2": 2000,
        "small3": 144,
    }
    assert ceiling[1] == {
        "cold": 2048,
        "small3": 1856,
        "hit0": 2048,
        "hit1": 2048,
    }
    assert ceiling[2] == {"cold": 2048, "hit0": 952, "hit1": 952}
    assert ceiling[3] == {"cold": 2048}
    floor = h.run_case(case(SEED_000, threshold=2048, mode="floor"))
    assert floor[2] == {"cold": 2048 + 8192 - 2048 - 952 - 952, "hit0": 952, "hit1": 952}
    assert floor[3] == {"cold": 8192}


def test_threshold_zero_equals_stock_on_every_case(pristine):
    cases = {
        "three_long_to_completion": {**case(THREE_LONG), "rounds": None},
        "seed_000_to_completion": {**case(SEED_000), "rounds": None},
        "pages": {
            "requests": [
                {"rid": "a", "need": 10_000},
                {"rid": "b", "need": 37},
                {"rid": "c", "need": 5_000},
            ],
            "engine": {"chunked_prefill_size": 4096, "page_size": 16},
        },
        "lpm": {
            "requests": [
                {"rid": "a", "need": 20_000},
                {"rid": "b", "need": 300},
                {"rid": "c", "need": 9_000},
            ],
            "engine": {"chunked_prefill_size": 4096, "policy": "lpm"},
        },
    }
    stock = pristine(cases)
    for name, c in cases.items():
        assert h.run_case(c) == stock[name], name
