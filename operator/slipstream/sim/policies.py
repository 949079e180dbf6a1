"""Scheduler policies of the twin, by name: ``KIND[:ARG][/ORDER]``.

| kind        | what it models                                                             |
|-------------|----------------------------------------------------------------------------|
| stock       | SGLang 0.5.18 as shipped: whole-request admission, one chunked request,     |
|             | prefill rounds run before decode                                           |
| ceiling:T   | the seed's patch: no request takes more than T a round (C // T at once)    |
| floor:T     | T guaranteed per long request, idle budget to partial prefills (work-conserving) |
| reflex:T    | ceiling:T in the passes where a short request (uncached need <= T) waits,   |
|             | stock in the others: the engine's own reflex to a giant's arrival          |
| sarathi:B   | stock's allocation with the decodes riding along: every pass carries all   |
|             | running decodes plus up to B prefill tokens (partials first, then new       |
|             | requests, one chunked request at a time). With B = C this is stock plus      |
|             | piggybacked decodes, NOT Sarathi-Serve's small token budget (B = 512..2048  |
|             | with the decodes counted in it); to model that, give a small B.            |
| vllm:T      | vLLM V1: decodes and prefills share the budget C, each request capped at T |
|             | (``long_prefill_token_threshold``); checked against V1's scheduler, below  |
| sglang-spf  | SGLang 0.5.23 ``--schedule-policy shortest-prefill-first``: shortest        |
|             | uncached prefill first, the one chunked request capped so shorter waiting   |
|             | requests fit beside it (``spf_chunk_limit``)                               |
| hrrn        | SGLang 0.5.23 ``--schedule-policy hrrn``: highest response ratio next,     |
|             | waiting measured in prefill tokens processed since arrival                 |
| auto        | T, mode and order set between rounds by a controller (the tuner)           |

The order (``/fcfs`` default, ``/lpm``, ``/srpt``, and 0.5.23's ``/spf`` and ``/hrrn``) is a second dimension of every kind
except ``sglang-spf`` and ``hrrn``, which are orders of their own (stock's allocation
otherwise). Each kind is a small factory in ``REGISTRY``; a policy is plain settings the
engine reads every round, so ``auto`` (and the tuner) can change them between rounds.

Sources, read for these models:

- SGLang 0.5.23 (``pip download --no-deps sglang==0.5.23``),
  ``sglang/srt/managers/schedule_policy.py``: ``SchedulePolicy._sort_by_shortest_prefill``
  (key: uncached work, then queue entry time), ``SchedulePolicy.shortest_prefill_chunk_limit``
  (the chunk cap), ``PrefillAdder._select_prefill_admission`` (under shortest-prefill-first a
  request that would need chunking is refused while a chunked request is in flight: "Only
  one unfinished chunked request can be tracked"), ``SchedulePolicy._sort_by_hrrn`` (key:
  ``-(processed_tokens - arrival_processed_tokens) / uncached``), and
  ``SchedulePolicy._determine_active_policy`` (lpm and hrrn, not shortest-prefill-first,
  turn into fcfs past 128 waiting requests, which leaves the list in its last order);
  ``sglang/srt/managers/scheduler.py``:
  ``get_new_batch_prefill`` (``adder.chunked_req_limit = shortest_prefill_chunk_limit(...)``
  before the chunked request is re-added) and ``run_batch`` (``processed_tokens_counter +=
  batch.extend_num_tokens``; each request snapshots it in ``_add_request_to_queue``).
- vLLM V1, ``vllm/v1/core/sched/scheduler.py`` ``Scheduler.schedule`` (vllm-project/vllm at
  commit 00024d314514900f361ad072af6931e403b7f589): running requests first, in the order
  they were admitted, each taking ``min(remaining, long_prefill_token_threshold,
  token_budget)`` (a decode takes 1); then waiting requests in the queue's order (the
  ``priority`` policy sorts by (priority, arrival), which is fcfs when priorities are
  equal), each ``min(T-capped remaining, token_budget)``. The twin serves all decodes
  first and then the partial prefills oldest first; that is the same split, because a
  decoding request is never refused its one token in V1: it was admitted when the
  requests ahead of it left budget, and those can only take less later (a partial's take
  never grows, a prefill that becomes a decode drops to 1). Not modelled: V1's KV
  preemption, ``max_num_seqs`` and its 16-token KV blocks (the twin's prefix cache
  follows SGLang's last-token rule).

How the queue runs SGLang's two orders each round (``calc_priority``: every waiting request
re-matched, in-batch prefix de-duplication, hrrn's last order kept past 128 waiting, ties by
``wait_queue_entry_time`` for spf and by a random rid for hrrn) is ``sim/upstream_orders.py``,
checked against SGLang 0.5.23's own ``SchedulePolicy.calc_priority`` in
tests/engine/test_upstream_orders.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from slipstream.sim.admission import (
    DEFAULT_REFLEX_HOLD_S,
    DEFAULT_SRPT_AGING_TOKENS_PER_S,
    MODES,
    AdmissionRule,
    HasNeed,
    allocate,
)

ORDERS = ("fcfs", "lpm", "srpt")
"""Orders every patched release runs (0.5.18 and 0.5.23): the tuner's default choice."""
QUEUE_ORDERS = (*ORDERS, "spf", "hrrn")
"""Every order the waiting queue knows, and a user may put after any kind (``/hrrn``):
SGLang 0.5.23's ``shortest-prefill-first`` (``spf``, with its chunk cap) and ``hrrn`` too."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The engine's fixed settings (what its command line would say)."""

    chunked_prefill_size: int = 8192
    """C, tokens per round (``--chunked-prefill-size``)."""
    page_size: int = 1
    """KV page size (``--page-size``)."""
    max_prefill_tokens: int | None = 16384
    """SGLang's ``--max-prefill-tokens`` admission check (default 16384)."""
    cache_tokens: int = 2_000_000
    """Device prefix-cache capacity in tokens (KV pool left for the radix cache)."""
    host_cache_tokens: int = 0
    """HiCache host-tier capacity in tokens; 0 = no host tier."""
    kv_pool_tokens: int | None = None
    """KV pool in tokens; None = the profile's (HBM less weights and activations), 0 = no
    memory limit (the twin before it modelled memory)."""
    max_running_requests: int = 2048
    """SGLang's ``--max-running-requests``: its default is pool / context length x 512
    clamped to 2048..4096, so 2048 for any pool under four context lengths."""
    max_partial_prefills: int = 8
    """``--max-partial-prefills`` of the patched engine: most partial prefills at once."""
    srpt_aging_tokens_per_s: float = DEFAULT_SRPT_AGING_TOKENS_PER_S
    """Aging of the srpt order, uncached tokens per second of waiting (see admission)."""
    reflex_hold_s: float = DEFAULT_REFLEX_HOLD_S
    """Reflex mode's hold H, engine seconds (``--long-prefill-reflex-hold-seconds``)."""

    def __post_init__(self) -> None:
        # Messages start with the field's name: spec.py points at that field's line.
        for name in ("chunked_prefill_size", "page_size", "max_running_requests",
                     "max_partial_prefills"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be an integer > 0, got {value!r}")
        for name in ("cache_tokens", "host_cache_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        pool = self.kv_pool_tokens
        if pool is not None and (isinstance(pool, bool) or not isinstance(pool, int) or pool < 0):
            raise ValueError(f"kv_pool_tokens must be an integer >= 0 (0 = no memory limit), "
                             f"got {pool!r}")
        m = self.max_prefill_tokens
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m <= 0):
            raise ValueError(f"max_prefill_tokens must be an integer > 0, got {m!r}")
        hold = self.reflex_hold_s
        if isinstance(hold, bool) or not isinstance(hold, int | float) or not 0 <= hold < float("inf"):
            raise ValueError(f"reflex_hold_s must be a finite number >= 0, got {hold!r}")
        aging = self.srpt_aging_tokens_per_s
        if not aging > 0 or aging == float("inf"):
            raise ValueError(f"srpt_aging_tokens_per_s must be a finite number > 0, got {aging!r}")


ENGINE_ORDERS = {"spf": "shortest-prefill-first"}
"""Twin order -> SGLang's ``--schedule-policy`` value, where the two names differ."""
TWIN_ORDERS = {engine: twin for twin, engine in ENGINE_ORDERS.items()}


def engine_order(order: str) -> str:
    """SGLang's name of a twin order (``spf`` -> ``shortest-prefill-first``)."""
    return ENGINE_ORDERS.get(order, order)


def twin_order(name: str) -> str:
    """The twin's name of an SGLang order (``shortest-prefill-first`` -> ``spf``)."""
    return TWIN_ORDERS.get(name, name)


@dataclass(frozen=True, slots=True)
class Setting:
    """What the tuner may change between rounds. ``order`` may be given by SGLang's name
    (``shortest-prefill-first``): it is kept by the twin's (``spf``)."""

    threshold: int
    mode: str = "ceiling"
    order: str = "fcfs"

    def __post_init__(self) -> None:
        if self.order in TWIN_ORDERS:
            object.__setattr__(self, "order", twin_order(self.order))


@dataclass(frozen=True, slots=True)
class FirstToken:
    """One request whose first token came out: what the engine's metrics record of it."""

    tenant: str
    arrival_s: float
    first_token_s: float
    prompt_tokens: int
    uncached_tokens: int
    output_tokens: int = 0
    """The request's output length. The engine's ``sglang:generation_tokens_histogram``
    counts it when the request finishes; the controller hook sees first tokens only, so a
    twin controller counts it here, its decode time earlier (0 = not given)."""


@dataclass(frozen=True, slots=True)
class RoundView:
    """What a controller sees at the start of a round (plain data).

    ``first_tokens`` are the requests whose first token came since the controller's last
    call (what Prometheus's histograms would have gained); ``waiting_needs`` and
    ``partial_sizes`` are what the engine's queue-mix gauges show of the requests with no
    first token yet; ``decoding`` is the engine's internal state, which no real controller
    can see.
    """

    now_s: float
    waiting_needs: tuple[int, ...]
    """Uncached tokens of each waiting request (re-matched against the cache while it waits)."""
    partial_sizes: tuple[int, ...]
    """Uncached tokens of each request part-way through its prefill, whole (as at its
    admission, as the engine's queue gauges count it), not what it still needs."""
    decoding: int
    first_tokens: tuple[FirstToken, ...] = ()


class Controller(Protocol):
    def __call__(self, view: RoundView) -> Setting | None: ...


Allocator = Callable[..., dict[str, int]]
"""``admission.allocate``'s signature (rule, partials, waiting, budget, **limits): a kind
whose split differs supplies its own."""


@dataclass(slots=True)
class Policy:
    """Mutable scheduler settings the engine reads at the start of every round."""

    name: str
    rule: AdmissionRule
    order: str = "fcfs"
    mixed: bool = False
    """Decodes ride in every pass beside the prefill chunks (sarathi, vllm)."""
    decodes_in_budget: bool = False
    """Mixed passes count each decode token against the budget (vLLM's
    max_num_batched_tokens); sarathi's B is the prefill chunk size, as in seed 003."""
    allocator: Allocator = allocate
    """Splits a round's budget (``admission.allocate`` unless the kind differs)."""
    controller: Controller | None = None
    interval_s: float = 0.0
    next_control_s: float = field(default=0.0)

    def apply(self, setting: Setting) -> None:
        """Change T, mode and order between rounds (validated like the engine's admin API;
        ``spf`` and ``hrrn`` as a 0.5.23 engine switches to them)."""
        if setting.order not in QUEUE_ORDERS:
            raise ValueError(f"order must be one of {QUEUE_ORDERS}, got {setting.order!r}")
        if self.allocator in (allocate, spf_allocate):
            self.allocator = spf_allocate if setting.order == "spf" else allocate
        rule = self.rule
        self.rule = AdmissionRule(
            rule.chunked_prefill_size,
            setting.threshold,
            setting.mode,
            rule.page_size,
            rule.max_prefill_tokens,
        )
        self.order = setting.order


class PolicyError(ValueError):
    """An unknown or malformed policy name."""


Factory = Callable[[int | None, EngineConfig], Policy]


def _rule(cfg: EngineConfig, threshold: int = 0, mode: str = "ceiling", budget: int | None = None,
          max_prefill: bool = True) -> AdmissionRule:
    return AdmissionRule(
        budget if budget is not None else cfg.chunked_prefill_size,
        threshold,
        mode,
        cfg.page_size,
        cfg.max_prefill_tokens if max_prefill else None,
    )


def _stock(arg: int | None, cfg: EngineConfig) -> Policy:
    return Policy("stock", _rule(cfg))


def _ceiling(arg: int | None, cfg: EngineConfig) -> Policy:
    return Policy(f"ceiling:{arg}", _rule(cfg, _need(arg, "ceiling"), "ceiling"))


def _floor(arg: int | None, cfg: EngineConfig) -> Policy:
    return Policy(f"floor:{arg}", _rule(cfg, _need(arg, "floor"), "floor"))


def _reflex(arg: int | None, cfg: EngineConfig) -> Policy:
    return Policy(f"reflex:{arg}", _rule(cfg, _need(arg, "reflex"), "reflex"))


def _sarathi(arg: int | None, cfg: EngineConfig) -> Policy:
    return Policy(f"sarathi:{arg}", _rule(cfg, budget=_need(arg, "sarathi"), max_prefill=False),
                  mixed=True, decodes_in_budget=False)


def _vllm(arg: int | None, cfg: EngineConfig) -> Policy:
    return Policy(f"vllm:{arg}", _rule(cfg, _need(arg, "vllm"), max_prefill=False), mixed=True,
                  decodes_in_budget=True)


def spf_chunk_limit(remaining: int, waiting_needs: Sequence[int], budget: int, page: int) -> int | None:
    """Cap on the chunked request's next chunk under SGLang 0.5.23's shortest-prefill-first.

    ``SchedulePolicy.shortest_prefill_chunk_limit`` (schedule_policy.py): walking the waiting
    queue in its (shortest-first) order, reserve the page-rounded work of every request
    shorter than what the chunked request has left, while the reservation stays within
    ``budget - page``; the chunk gets the rest, page-aligned. None (no cap) when nothing is
    reserved or the budget is under two pages. Without the cap a long prompt in flight would
    hold the whole budget and the short requests the order put first would still wait.
    """
    if budget < 2 * page:
        return None
    reserved = 0
    for need in waiting_needs:
        work = max(1, need)
        charge = -(-work // page) * page
        if work >= remaining or reserved + charge > budget - page:
            break
        reserved += charge
    if not reserved:
        return None
    return (budget - reserved) // page * page


def spf_allocate(rule: AdmissionRule, partials: Sequence[HasNeed], waiting: Sequence[HasNeed],
                 budget: int | None = None, *, kv_free: int | None = None,
                 max_partials: int | None = None, **rest: Any) -> dict[str, int]:
    """A round under the ``spf`` order: with T = 0 (``sglang-spf``) stock's split with the
    chunked request (at most one) capped by ``spf_chunk_limit`` (``adder.chunked_req_limit``
    in scheduler.py); with T > 0 the patch's split with each partial capped by T and by
    ``spf_chunk_limit`` in turn (the 0.5.23 patch's ``_get_new_batch_prefill_long``).

    ``waiting`` is already in shortest-prefill order (the queue's ``spf`` order). The
    capped chunk is served here and the rest of the round is ``admission.allocate``'s, with
    what the chunk used taken off the budget, the ``max_prefill_tokens`` check, the
    partials bound and the KV left (its chunk, one page, and the unbuilt remainder it
    keeps reserved, as allocate would charge a partial). SGLang also refuses to start a
    second chunked request while one is unfinished (``_select_prefill_admission``); in the
    twin that never binds: the capped chunk leaves less than a page of budget.
    """
    if rule.threshold > 0:
        # The patch: every partial's chunk is capped by T and by the limit computed for it
        # against the waiting queue with the budget left when its turn comes.
        needs = [w.need for w in waiting]
        page = rule.page_size

        def limit_of(c: HasNeed, left: int) -> int | None:
            return spf_chunk_limit(c.need, needs, left, page)

        return allocate(rule, partials, waiting, budget, kv_free=kv_free, max_partials=max_partials,
                        chunk_limit=limit_of, **rest)
    rem = rule.chunked_prefill_size if budget is None else budget
    page = rule.page_size
    limit = (spf_chunk_limit(partials[0].need, [w.need for w in waiting], rem, page)
             if partials else None)
    if limit is None or limit >= partials[0].need:
        return allocate(rule, partials, waiting, budget, kv_free=kv_free,
                        max_partials=max_partials, **rest)
    head = partials[0]
    take = limit  # page-aligned, under the budget and under the chunk's need
    used = -(-take // page) * page
    m = rule.max_prefill_tokens
    tail_rule = replace(rule, max_prefill_tokens=None if m is None else m - used)
    if kv_free is not None:
        kv_free -= used + page + -(-(head.need - take) // page) * page
    if max_partials is not None:
        max_partials -= 1
    tail = allocate(tail_rule, partials[1:], waiting, rem - used, kv_free=kv_free,
                    max_partials=max_partials, **rest)
    return {head.rid: take, **tail}


def _sglang_spf(arg: int | None, cfg: EngineConfig) -> Policy:
    return Policy("sglang-spf", _rule(cfg), order="spf", allocator=spf_allocate)


def _hrrn(arg: int | None, cfg: EngineConfig) -> Policy:
    return Policy("hrrn", _rule(cfg), order="hrrn")


def _auto(arg: int | None, cfg: EngineConfig) -> Policy:
    return Policy("auto", _rule(cfg, arg or 0))


def _need(arg: int | None, kind: str) -> int:
    if arg is None:
        raise PolicyError(f"policy '{kind}' needs a token count, e.g. '{kind}:4096'")
    return arg


REGISTRY: dict[str, Factory] = {
    "stock": _stock,
    "ceiling": _ceiling,
    "floor": _floor,
    "reflex": _reflex,
    "sarathi": _sarathi,
    "vllm": _vllm,
    "sglang-spf": _sglang_spf,
    "hrrn": _hrrn,
    "auto": _auto,
}

OWN_ORDER = ("sglang-spf", "hrrn")
"""Kinds that are an order themselves: no argument, no ``/ORDER``."""

DEFAULT_BENCH = (
    "stock",
    "stock/srpt",
    "ceiling:4096",
    "floor:4096",
    "ceiling:4096/srpt",
    "ceiling:2048/srpt",
    "floor:4096/srpt",
    "sarathi:8192",
    "vllm:4096",
    "sglang-spf",
    "hrrn",
)


def parse(name: str, cfg: EngineConfig, controller: Controller | None = None,
          interval_s: float = 5.0) -> Policy:
    """A policy from its name, e.g. ``floor:2048/srpt``; PolicyError says what is wrong."""
    text = name.strip()
    body, _, order = text.partition("/")
    order = order or "fcfs"
    if order not in QUEUE_ORDERS:
        raise PolicyError(f"policy {name!r}: unknown order {order!r}; use one of {', '.join(QUEUE_ORDERS)}")
    kind, sep, arg_text = body.partition(":")
    if kind not in REGISTRY:
        raise PolicyError(
            f"unknown policy {name!r}: use one of {', '.join(REGISTRY)} "
            "(with ':N' where needed and an optional order: '/fcfs', '/lpm', '/srpt', '/spf' or '/hrrn')"
        )
    arg: int | None = None
    if sep and kind in ("stock", *OWN_ORDER):
        raise PolicyError(f"policy {name!r}: '{kind}' takes no argument")
    if kind in OWN_ORDER and text.count("/"):
        raise PolicyError(f"policy {name!r}: '{kind}' is an order of its own; drop '/{order}'")
    if sep:
        try:
            arg = int(arg_text)
        except ValueError:
            raise PolicyError(f"policy {name!r}: '{arg_text}' is not a token count") from None
        if arg <= 0:
            raise PolicyError(f"policy {name!r}: the token count must be > 0")
    if kind == "auto" and controller is None:
        raise PolicyError(
            "policy 'auto' needs a controller (the closed-loop tuner) plugged in: the "
            "slipstream CLI plugs in slipstream.tune's; in Python pass controller="
            "slipstream.tune.auto.TwinAuto(...)"
        )
    try:
        policy = REGISTRY[kind](arg, cfg)
    except ValueError as exc:
        raise PolicyError(f"policy {name!r}: {exc}") from None
    if kind not in OWN_ORDER:
        policy.order = order
        policy.name = f"{policy.name}/{order}" if order != "fcfs" else policy.name
        if order == "spf" and policy.allocator is allocate:
            policy.allocator = spf_allocate
    if controller is not None:
        policy.controller = controller
        policy.interval_s = interval_s
    return policy


__all__ = ["MODES", "ORDERS", "QUEUE_ORDERS", "EngineConfig", "FirstToken", "Policy", "PolicyError", "RoundView", "Setting", "parse"]
