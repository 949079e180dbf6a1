"""Scheduler policies of the twin, by name: ``KIND[:ARG][/ORDER]``.

| kind        | what it models                                                             |
|-------------|----------------------------------------------------------------------------|
| stock       | SGLang 0.5.18 as shipped: whole-request admission, one chunked request,     |
|             | prefill rounds run before decode                                           |
| ceiling:T   | the seed's patch: no request takes more than T a round (C // T at once)    |
| floor:T     | T guaranteed per long request, idle budget to partial prefills (work-conserving) |
| sarathi:B   | stall-free batching: every pass carries all running decodes plus up to B   |
|             | prefill tokens (partial prefills first, then new requests); B is seed 003's |
|             | chunk size (Sarathi-Serve's token budget is B + the decodes)               |
| vllm:T      | vLLM V1: decodes and prefills share the budget C, each request capped at T |
| auto        | T, mode and order set between rounds by a controller (the tuner)           |

The order (``/fcfs`` default, ``/lpm``, ``/srpt``) is a second dimension of every kind.
Each kind is a small factory in ``REGISTRY``; a policy is plain settings the engine reads
every round, so ``auto`` (and the tuner) can change them between rounds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from slipstream.sim.admission import DEFAULT_SRPT_AGING_TOKENS_PER_S, MODES, AdmissionRule

ORDERS = ("fcfs", "lpm", "srpt")


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
    srpt_aging_tokens_per_s: float = DEFAULT_SRPT_AGING_TOKENS_PER_S
    """Aging of the srpt order, uncached tokens per second of waiting (see admission)."""

    def __post_init__(self) -> None:
        # Messages start with the field's name: spec.py points at that field's line.
        for name in ("chunked_prefill_size", "page_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be an integer > 0, got {value!r}")
        for name in ("cache_tokens", "host_cache_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        m = self.max_prefill_tokens
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m <= 0):
            raise ValueError(f"max_prefill_tokens must be an integer > 0, got {m!r}")
        aging = self.srpt_aging_tokens_per_s
        if not aging > 0 or aging == float("inf"):
            raise ValueError(f"srpt_aging_tokens_per_s must be a finite number > 0, got {aging!r}")


@dataclass(frozen=True, slots=True)
class Setting:
    """What the tuner may change between rounds."""

    threshold: int
    mode: str = "ceiling"
    order: str = "fcfs"


@dataclass(frozen=True, slots=True)
class FirstToken:
    """One request whose first token came out: what the engine's metrics record of it."""

    tenant: str
    arrival_s: float
    first_token_s: float
    prompt_tokens: int
    uncached_tokens: int


@dataclass(frozen=True, slots=True)
class RoundView:
    """What a controller sees at the start of a round (plain data).

    ``first_tokens`` are the requests whose first token came since the controller's last
    call (what Prometheus's histograms would have gained); the other fields are the
    engine's internal state, which no real controller can see: ``auto`` uses only
    ``now_s`` and ``first_tokens``.
    """

    now_s: float
    waiting_needs: tuple[int, ...]
    partial_needs: tuple[int, ...]
    decoding: int
    first_tokens: tuple[FirstToken, ...] = ()


class Controller(Protocol):
    def __call__(self, view: RoundView) -> Setting | None: ...


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
    controller: Controller | None = None
    interval_s: float = 0.0
    next_control_s: float = field(default=0.0)

    def apply(self, setting: Setting) -> None:
        """Change T, mode and order between rounds (validated like the engine's admin API)."""
        if setting.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {setting.order!r}")
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


def _sarathi(arg: int | None, cfg: EngineConfig) -> Policy:
    return Policy(f"sarathi:{arg}", _rule(cfg, budget=_need(arg, "sarathi"), max_prefill=False),
                  mixed=True, decodes_in_budget=False)


def _vllm(arg: int | None, cfg: EngineConfig) -> Policy:
    return Policy(f"vllm:{arg}", _rule(cfg, _need(arg, "vllm"), max_prefill=False), mixed=True,
                  decodes_in_budget=True)


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
    "sarathi": _sarathi,
    "vllm": _vllm,
    "auto": _auto,
}

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
)


def parse(name: str, cfg: EngineConfig, controller: Controller | None = None,
          interval_s: float = 5.0) -> Policy:
    """A policy from its name, e.g. ``floor:2048/srpt``; PolicyError says what is wrong."""
    text = name.strip()
    body, _, order = text.partition("/")
    order = order or "fcfs"
    if order not in ORDERS:
        raise PolicyError(f"policy {name!r}: unknown order {order!r}; use one of {', '.join(ORDERS)}")
    kind, sep, arg_text = body.partition(":")
    if kind not in REGISTRY:
        raise PolicyError(
            f"unknown policy {name!r}: use one of {', '.join(REGISTRY)} "
            "(with ':N' where needed and an optional '/fcfs', '/lpm' or '/srpt')"
        )
    arg: int | None = None
    if sep and kind == "stock":
        raise PolicyError(f"policy {name!r}: 'stock' takes no argument")
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
    policy.order = order
    policy.name = f"{policy.name}/{order}" if order != "fcfs" else policy.name
    if controller is not None:
        policy.controller = controller
        policy.interval_s = interval_s
    return policy


__all__ = ["MODES", "ORDERS", "EngineConfig", "FirstToken", "Policy", "PolicyError", "RoundView", "Setting", "parse"]
