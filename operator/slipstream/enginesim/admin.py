"""The admin side of the simulated engine (pure): the settings /set_internal_state may
change and how it validates them, the faults tests inject, and the redacted server info.

The rules and messages are the Slipstream patch's (engine_image/patches/, long_prefill.py
and Scheduler._set_long_prefill_state): the long-prefill settings are validated all
together and applied all or nothing; a refusal keeps the old values and says why, with
HTTP 400 and ``{"updated": false, "reason": ...}``; success is HTTP 200 with
``{"updated": true, ...}`` (what ``slipstream.engine.admin.AdminClient`` expects).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from slipstream.api import versions
from slipstream.enginesim import flags
from slipstream.enginesim.bodies import BodyError
from slipstream.sim import admission

LONG_PREFILL_KEYS = ("long_prefill_token_threshold", "long_prefill_mode", "schedule_policy",
                     "max_partial_prefills", "long_prefill_reflex_hold_seconds")
"""What /set_internal_state changes in place (the tuned triple, the partials cap and
reflex mode's hold), as the patched engine's allowlist."""
REDACTED = "<redacted>"
"""What an info endpoint shows for a secret that is set, as the patched engine does
(engine_image/patches: ``secrets_redaction.redact_secrets``); an unset one stays null."""


def redacted_secrets(cfg: flags.SimConfig) -> dict[str, str | None]:
    """``admin_api_key`` and ``api_key`` as the patched engine's info endpoints show them
    (the simulator takes no ``--api-key``, so that one is always null)."""
    return {"admin_api_key": REDACTED if cfg.admin_api_key else None, "api_key": None}


@dataclass(frozen=True, slots=True)
class Live:
    """The settings in force."""

    threshold: int
    mode: str
    schedule_policy: str
    max_partial_prefills: int
    reflex_hold_s: float = admission.DEFAULT_REFLEX_HOLD_S


def server_args_of(body: dict[str, Any]) -> dict[str, Any]:
    """``{"server_args": {...}}`` -> the updates; BodyError if the shape is wrong."""
    args = body.get("server_args")
    if not isinstance(args, dict) or not args:
        raise BodyError('server_args: must be a non-empty object, e.g. '
                        '{"server_args": {"long_prefill_token_threshold": 2048}}')
    for key, value in args.items():
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise BodyError(f"server_args.{key}: must be a number or a string, got {value!r}")
    return args


def apply_updates(live: Live, updates: dict[str, Any], chunked_prefill_size: int,
                  page_size: int, version: str = versions.NEWEST) -> tuple[Live, str | None]:
    """The settings after ``updates``, or the unchanged settings and the refusal's reason."""
    others = [k for k in updates if k not in LONG_PREFILL_KEYS]
    if others:
        return live, (f"{others} cannot be changed at run time on this engine; settable: "
                      f"{list(LONG_PREFILL_KEYS)}")
    threshold = updates.get("long_prefill_token_threshold", live.threshold)
    if isinstance(threshold, float) and threshold.is_integer():
        threshold = int(threshold)
    partials = updates.get("max_partial_prefills", live.max_partial_prefills)
    err = None
    if "long_prefill_token_threshold" in updates:
        err = flags.threshold_error(threshold, chunked_prefill_size, page_size)
    if err is None and "max_partial_prefills" in updates:
        err = flags.max_partials_error(partials)
    if err is None and "long_prefill_mode" in updates:
        err = flags.mode_error(updates["long_prefill_mode"])
    if err is None and "schedule_policy" in updates:
        err = flags.policy_error(updates["schedule_policy"], version)
    hold = updates.get("long_prefill_reflex_hold_seconds", live.reflex_hold_s)
    if err is None and "long_prefill_reflex_hold_seconds" in updates:
        err = flags.hold_error(hold)
    if err is not None:
        return live, err
    return Live(int(threshold), updates.get("long_prefill_mode", live.mode),
                updates.get("schedule_policy", live.schedule_policy), int(partials), float(hold)), None


@dataclass(frozen=True, slots=True)
class Faults:
    """Injected misbehaviour (POST /slipstream/faults)."""

    ttft_multiplier: float = 1.0
    """Every request's TTFT is this many times the twin's (a regressing canary)."""
    ttft_multiplier_at_threshold: int | None = None
    """Apply ``ttft_multiplier`` only to requests arriving while the pod runs this
    long-prefill token threshold (None: always): a setting that regresses on this engine,
    slow from the moment a canary switches to it, and not before."""
    admin: str = "ok"
    """ok | error (HTTP 500) | timeout (never answers) | refuse (connection dropped):
    how /set_internal_state, /get_server_info and /server_info answer."""
    metrics: str = "ok"
    """ok | garbage (HTTP 200, not Prometheus text) | error (HTTP 500): how /metrics answers."""


ADMIN_FAULTS = ("ok", "error", "timeout", "refuse", "write-error")
"""write-error: /set_internal_state answers 500 while the reads answer (a change that never takes)."""
METRICS_FAULTS = ("ok", "garbage", "error")


def faults_of(body: dict[str, Any], current: Faults) -> Faults:
    """The faults after a POST (fields left out keep their value); BodyError names the field."""
    known = ("ttft_multiplier", "ttft_multiplier_at_threshold", "admin", "metrics")
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise BodyError(f"unknown fault field(s) {unknown}; known: {list(known)}")
    out = current
    if "ttft_multiplier" in body:
        m = body["ttft_multiplier"]
        if isinstance(m, bool) or not isinstance(m, int | float) or not math.isfinite(m) or m <= 0:
            raise BodyError(f"ttft_multiplier: must be a finite number > 0, got {m!r}")
        out = replace(out, ttft_multiplier=float(m))
    if "ttft_multiplier_at_threshold" in body:
        t = body["ttft_multiplier_at_threshold"]
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 0):
            raise BodyError(f"ttft_multiplier_at_threshold: must be a threshold (an int >= 0) or null, got {t!r}")
        out = replace(out, ttft_multiplier_at_threshold=t)
    for name, allowed in (("admin", ADMIN_FAULTS), ("metrics", METRICS_FAULTS)):
        if name in body:
            if body[name] not in allowed:
                raise BodyError(f"{name}: must be one of {list(allowed)}, got {body[name]!r}")
            out = replace(out, **{name: body[name]})
    return out


def server_info(cfg: flags.SimConfig, live: Live, partials: int, extra: dict[str, Any],
                kv_pool_tokens: int | None = None) -> dict[str, Any]:
    """/get_server_info and /server_info: the server args with the live settings over the
    start-up ones, secrets shown as null, and, as SGLang's scheduler info, the KV pool in
    tokens (``max_total_num_tokens``: ``--max-total-tokens``, else what the profile's HBM
    holds; null when the twin models no memory), which the operator's tuner runs with."""
    state = {
        "long_prefill_token_threshold": live.threshold,
        "long_prefill_mode": live.mode,
        "schedule_policy": live.schedule_policy,
        "max_partial_prefills": live.max_partial_prefills,
        "long_prefill_reflex_hold_seconds": live.reflex_hold_s,
        "srpt_aging_tokens_per_s": cfg.srpt_aging_tokens_per_s,
        "num_partial_prefills": partials,
    }
    info: dict[str, Any] = {
        "model_path": cfg.model_name,
        "served_model_name": cfg.model_name,
        "host": cfg.host,
        "port": cfg.port,
        "chunked_prefill_size": cfg.chunked_prefill_size,
        "page_size": cfg.page_size,
        "context_length": cfg.context_length,
        "max_total_tokens": cfg.max_total_tokens,
        "tokenizer_metrics_custom_labels_header": cfg.labels_header,
        "tokenizer_metrics_allowed_custom_labels": list(cfg.allowed_labels) or None,
        "enable_metrics": cfg.enable_metrics,
        "admin_api_key_file": cfg.admin_api_key_file,
        **redacted_secrets(cfg),
        **state,
        "max_total_num_tokens": kv_pool_tokens,
        "internal_states": [{**state, **redacted_secrets(cfg)}],
        "version": f"{cfg.sglang_version}+slipstream-engine-sim",
        "engine_sim": extra,
    }
    return info
