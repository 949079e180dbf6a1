"""YAML workload specs: what traces lack (tenants, cache hits, giant cold prompts).

A spec may list requests explicitly (the seed scenarios do), generate them per tenant,
or both::

    name: multi-tenant
    description: ...
    profile: kimi-k3-8xh200          # optional: the profile the scenario is stated on
    engine: {chunked_prefill_size: 8192, page_size: 1, cache_tokens: 2000000}
    seed: 7                          # one RNG per run
    duration_s: 600                  # for generated tenants
    requests:                        # explicit requests
      - {id: cold, arrival_s: 0.0, prompt_tokens: 600000, cached_tokens: 0, output_tokens: 1}
    tenants:                         # generated requests
      - name: chat
        rate_per_s: 1.5              # Poisson arrivals
        prompt_tokens: {dist: lognormal, median: 6000, sigma: 1.0, min: 64, max: 128000}
        output_tokens: {dist: lognormal, median: 250, sigma: 0.8, min: 1, max: 2000}
        cache_hit: 0.4               # share of each prompt cached when it arrives
        shared_prefix_tokens: 1500   # one system prompt shared by the tenant's requests
        giant: {rate_per_hour: 12, prompt_tokens: {dist: uniform, min: 200000, max: 600000}}
      - name: agent                  # multi-turn sessions: rate_per_s starts sessions
        rate_per_s: 0.2
        prompt_tokens: {dist: lognormal, median: 2000, sigma: 0.8}  # each turn's new tokens
        output_tokens: {dist: constant, value: 200}
        sessions: {turns: {dist: uniform, min: 2, max: 12}, think_s: {dist: constant, value: 20}}

``cached_tokens``/``cache_hit`` become a block placed in the prefix cache when the
request arrives (``Request.warm_blocks``), so the hit survives only if the cache
keeps it, wherever the request lands. A tenant with ``sessions`` states where hits come
from instead: turn k's prompt is turn k-1's prompt (its blocks), turn k-1's output and
the turn's new ``prompt_tokens``, so it hits only on an engine that ran the earlier turns
(``sim.fleet``'s routers decide which); ``sessions`` excludes ``cache_hit`` and ``giant``,
and ``turns`` is at most 10,000. Errors name the file, the line and the field (``spec.yaml:12: requests[3]
(cold): field 'arrival_s' must be a finite number``); numbers must be finite (``.nan`` and
``.inf`` are refused) and request ids unique. ``1e12`` (no dot) is a number, as in YAML 1.2.

Bounds (``slipstream.sim.bounds``; a value above one is refused, naming file, field and
bound, before anything is generated):

- ``duration_s`` and every ``arrival_s``: <= 10,000,000 s; ``arrival_s`` >= 0 (only the
  built-in seed-003 starts streams before 0);
- requests in all: <= 2,000,000, counting explicit ones plus the tenants' expected
  ``(rate_per_s + giant.rate_per_hour / 3600) x duration_s`` (with ``sessions``,
  ``rate_per_s`` times the mean of ``turns``);
- ``prompt_tokens``, ``cached_tokens``, ``shared_prefix_tokens`` and the prompt
  distributions' ``value``/``median``/``min``/``max``: <= 100,000,000 tokens; the CLI also
  refuses a prompt longer than the KV pool in use, naming its id;
- ``output_tokens`` and the output distributions' parameters: <= 10,000,000 tokens;
- ``rate_per_s`` <= 100,000; ``giant.rate_per_hour`` <= 360,000; ``sigma`` <= 10;
  ``cache_hit`` < 1; ``seed`` <= 2^63 - 1;
- ``engine:`` ``chunked_prefill_size`` <= 16,777,216, ``page_size`` <= 65,536,
  ``max_prefill_tokens`` <= 100,000,000, ``cache_tokens`` and ``kv_pool_tokens`` <=
  10,000,000,000, ``host_cache_tokens`` <= 100,000,000,000, ``max_running_requests`` <=
  1,000,000, ``max_partial_prefills`` <= 4,096, ``srpt_aging_tokens_per_s`` <=
  1,000,000,000,000.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from slipstream.sim import bounds
from slipstream.sim.policies import EngineConfig
from slipstream.sim.workload import BLOCK_SPACE, Request, Workload, build


class SpecError(ValueError):
    """A workload spec that cannot be used; the message names file, line and field."""


class _Map(dict):  # type: ignore[type-arg]
    """A YAML mapping that remembers its line and each key's line (1-based)."""

    line: int = 0
    lines: dict[Any, int]


class _Loader(yaml.SafeLoader):
    """``yaml.safe_load`` whose mappings keep line numbers for error messages."""


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> _Map:
    loader.flatten_mapping(node)
    out = _Map(loader.construct_pairs(node, deep=True))
    out.line = node.start_mark.line + 1
    out.lines = {loader.construct_object(k, deep=True): k.start_mark.line + 1
                 for k, _ in node.value}
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
# PyYAML follows YAML 1.1, whose floats need a dot and a signed exponent: ``1e12`` and
# ``1.0e12`` would be strings. YAML 1.2 (and JSON) read them as numbers, and so does a spec.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _fail(where: str, obj: Any, key: str | None, message: str) -> SpecError:
    """An error whose prefix ``origin: path`` gains the line of ``key`` in ``obj``."""
    line = None
    if isinstance(obj, _Map):
        line = obj.lines.get(key, obj.line) if key is not None else obj.line
    if line is not None:
        origin, sep, rest = where.partition(": ")
        where = f"{origin}:{line}: {rest}" if sep else f"{where}:{line}"
    return SpecError(f"{where}: {message}")


@dataclass(frozen=True, slots=True)
class Spec:
    workload: Workload
    engine: EngineConfig
    profile: str | None


_ENGINE_FIELDS = {
    "chunked_prefill_size": int,
    "page_size": int,
    "max_prefill_tokens": int,
    "cache_tokens": int,
    "host_cache_tokens": int,
    "srpt_aging_tokens_per_s": float,
    "kv_pool_tokens": int,
    "max_running_requests": int,
    "max_partial_prefills": int,
}


def builtin_names() -> list[str]:
    folder = resources.files("slipstream.sim") / "scenarios"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_builtin(name: str) -> Spec:
    if name not in builtin_names():
        raise SpecError(f"unknown scenario {name!r}: use one of {', '.join(builtin_names())}")
    text = (resources.files("slipstream.sim") / "scenarios" / f"{name}.yaml").read_text()
    # seed-003 starts its streams 5 s before t = 0, the prompt's arrival, as the seed's
    # explainer states it; only the built-in scenarios may place requests before 0.
    return parse(text, origin=f"builtin:{name}", tenant_base=0, negative_arrivals=True)


def load_file(path: str | Path, tenant_base: int = 0) -> Spec:
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{p}: workload spec does not exist")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{p}: cannot be decoded as UTF-8 text (byte {exc.start}: a binary "
                        "file?); a workload spec is a YAML file") from None
    except OSError as exc:
        raise SpecError(f"{p}: cannot read the workload spec ({exc.strerror})") from None
    return parse(text, origin=str(p), tenant_base=tenant_base)


def load(ref: str, tenant_base: int = 0) -> Spec:
    """``builtin:NAME``, a bare built-in name, or a YAML file path."""
    if ref.startswith("builtin:"):
        return load_builtin(ref.removeprefix("builtin:"))
    if not ref.endswith((".yaml", ".yml")) and ref in builtin_names():
        return load_builtin(ref)
    return load_file(ref, tenant_base)


def parse(text: str, origin: str, tenant_base: int = 0, negative_arrivals: bool = False) -> Spec:
    """The spec in ``text``; ``origin`` (a file name) prefixes every error."""
    try:
        doc = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: an int of > 4,300 digits
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise SpecError(f"{origin}{line}: not valid YAML") from None
    if not isinstance(doc, dict):
        raise SpecError(f"{origin}: a workload spec is a YAML mapping")
    known = {"name", "description", "profile", "engine", "seed", "duration_s", "requests", "tenants"}
    _no_unknown(doc, known, origin)
    name = str(doc.get("name") or Path(origin).stem)
    engine = _engine(doc.get("engine") or {}, f"{origin}: engine")
    rng = random.Random(_num(doc, "seed", origin, int, 0, bounds.MAX_SEED))
    requests: list[Request] = []
    next_block = tenant_base * BLOCK_SPACE
    seen: dict[str, str] = {}
    items = doc.get("requests") or []
    if not isinstance(items, list):
        raise _fail(origin, doc, "requests", "field 'requests' must be a list of mappings")
    for idx, item in enumerate(items):
        where = f"{origin}: requests[{idx}]"
        req, next_block = _explicit(item, where, next_block, negative_arrivals)
        _unique(req.rid, f"{where} ({req.rid})", item, "id", seen)
        requests.append(req)
    tenants = doc.get("tenants") or []
    if not isinstance(tenants, list):
        raise _fail(origin, doc, "tenants", "field 'tenants' must be a list of mappings")
    if tenants:
        duration = _num(doc, "duration_s", origin, float, None, bounds.MAX_SPAN_S)
        if duration is None or duration <= 0:
            raise _fail(origin, doc, "duration_s", "field 'duration_s' (> 0) is required with 'tenants'")
        _check_expected_requests(doc, tenants, origin, duration, len(requests))
        for idx, tenant in enumerate(tenants):
            base = (tenant_base + idx + 1) * BLOCK_SPACE
            where = f"{origin}: tenants[{idx}]"
            generated = _generate(tenant, where, rng, duration, base)
            for req in generated:
                _unique(req.rid, f"{where} ({tenant['name']})", tenant, "name", seen)
            requests += generated
    if not requests:
        raise SpecError(f"{origin}: the spec has neither 'requests' nor 'tenants'")
    profile = doc.get("profile")
    if profile is not None and not isinstance(profile, str):
        raise _fail(origin, doc, "profile", "field 'profile' must be a profile name")
    return Spec(build(name, requests, str(doc.get("description") or "")), engine, profile)


def _no_unknown(obj: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(obj) - known, key=str)
    if unknown:
        raise _fail(where, obj, unknown[0],
                    f"unknown field(s) {unknown}; known: {sorted(known)} (remove or rename it)")


def _unique(rid: str, where: str, obj: Any, key: str, seen: dict[str, str]) -> None:
    if rid in seen:
        raise _fail(where, obj, key, f"request id {rid!r} is used twice (first by {seen[rid]}); "
                    "ids must be unique")
    seen[rid] = where


def _check_expected_requests(doc: dict[str, Any], tenants: list[Any], origin: str,
                             duration: float, explicit: int) -> None:
    """Refuse, before generating anything, a spec whose tenants would generate more than
    ``bounds.MAX_REQUESTS`` requests on average: each rate is bounded alone, but their
    product with ``duration_s`` is what the generator's loop and memory pay for."""
    per_s = 0.0
    for idx, tenant in enumerate(tenants):
        if not isinstance(tenant, dict):
            continue  # _generate names it
        where = f"{origin}: tenants[{idx}] ({tenant.get('name')})"
        # a negative rate is refused by _generate; it must not offset another tenant's here
        per_s += max(0.0, _num(tenant, "rate_per_s", where, float, 0.0, bounds.MAX_RATE_PER_S)) * expected_turns(
            tenant, where)
        giant = tenant.get("giant")
        if isinstance(giant, dict):
            per_s += max(0.0, _num(giant, "rate_per_hour", f"{where}: giant", float, 0.0,
                                   bounds.MAX_GIANT_RATE_PER_HOUR)) / 3600.0
    expected = explicit + per_s * duration
    if expected > bounds.MAX_REQUESTS:
        raise _fail(origin, doc, "duration_s",
                    f"the spec would hold about {expected:.3g} requests (requests + the sum of "
                    f"(rate_per_s + giant.rate_per_hour / 3600) x duration_s {duration:g}), "
                    f"more than the bound of {bounds.words(bounds.MAX_REQUESTS)}: shorten "
                    "duration_s or lower the rates")


def _num(obj: dict[str, Any], key: str, where: str, kind: type, default: Any,
         bound: float) -> Any:
    """Field ``key`` of ``obj`` as ``kind``, finite and at most ``bound``; absent: ``default``."""
    if key not in obj or obj[key] is None:
        return default
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _fail(where, obj, key, f"field '{key}' must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise _fail(where, obj, key, f"field '{key}' must be a finite number, got {value!r}")
    if kind is int and value != int(value):
        raise _fail(where, obj, key, f"field '{key}' must be an integer, got {value!r}")
    if value > bound:
        raise _fail(where, obj, key, f"field '{key}' must be <= {bounds.words(bound)} "
                    f"(the bound in slipstream.sim.bounds), got {bounds.shown(value)}")
    return kind(value)


def _engine(obj: Any, where: str) -> EngineConfig:
    if not isinstance(obj, dict):
        raise _fail(where, obj, None, "field 'engine' must be a mapping")
    _no_unknown(obj, set(_ENGINE_FIELDS), where)
    kwargs = {k: _num(obj, k, where, t, None, bounds.ENGINE[k]) for k, t in _ENGINE_FIELDS.items()}
    try:
        return EngineConfig(**{k: v for k, v in kwargs.items() if v is not None})
    except (TypeError, ValueError) as exc:
        # EngineConfig's messages start with the field's name
        key = str(exc).split(" ", 1)[0]
        raise _fail(where, obj, key, f"field '{key}': {exc}") from None


_REQUEST_FIELDS = {"id", "tenant", "arrival_s", "prompt_tokens", "cached_tokens", "output_tokens"}


def _explicit(item: Any, where: str, next_block: int,
              negative_arrivals: bool = False) -> tuple[Request, int]:
    if not isinstance(item, dict):
        raise _fail(where, item, None, "each request is a mapping")
    rid = item.get("id")
    if not isinstance(rid, str) or not rid:
        raise _fail(where, item, "id", "field 'id' (a string) is required")
    where = f"{where} ({rid})"
    _no_unknown(item, _REQUEST_FIELDS, where)
    arrival = _num(item, "arrival_s", where, float, None, bounds.MAX_SPAN_S)
    prompt = _num(item, "prompt_tokens", where, int, None, bounds.MAX_PROMPT_TOKENS)
    if arrival is None:
        raise _fail(where, item, "arrival_s", "field 'arrival_s' is required")
    if arrival < 0 and not negative_arrivals:
        raise _fail(where, item, "arrival_s", f"field 'arrival_s' must be >= 0 (seconds from "
                    f"the workload's start), got {arrival:g}")
    if prompt is None or prompt <= 0:
        raise _fail(where, item, "prompt_tokens", "field 'prompt_tokens' must be > 0")
    cached = _num(item, "cached_tokens", where, int, 0, bounds.MAX_PROMPT_TOKENS)
    if not 0 <= cached < prompt:
        raise _fail(where, item, "cached_tokens",
                    f"field 'cached_tokens' must be >= 0 and < prompt_tokens ({prompt})")
    output = _num(item, "output_tokens", where, int, 1, bounds.MAX_OUTPUT_TOKENS)
    if output < 1:
        raise _fail(where, item, "output_tokens", "field 'output_tokens' must be >= 1")
    tenant = str(item.get("tenant") or rid)
    req, next_block = _request(rid, tenant, arrival, prompt, cached, output, next_block)
    return req, next_block


def _request(rid: str, tenant: str, arrival: float, prompt: int, cached: int, output: int,
             next_block: int, shared: tuple[int, int] | None = None) -> tuple[Request, int]:
    """Blocks: [tenant's shared prefix], [cached part, warm on arrival], the request's own."""
    blocks: list[int] = []
    sizes: list[int] = []
    if shared is not None and shared[1] + cached < prompt:
        blocks.append(shared[0])
        sizes.append(shared[1])
    if cached:
        blocks.append(next_block)
        sizes.append(cached)
        next_block += 1
    warm = len(blocks) if cached else 0
    blocks.append(next_block)
    sizes.append(prompt - sum(sizes))
    next_block += 1
    return Request(rid, tenant, arrival, prompt, output, tuple(blocks), tuple(sizes),
                   warm_blocks=warm), next_block


def _dist(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict) or obj.get("dist") not in ("lognormal", "uniform", "constant"):
        raise _fail(where, obj, "dist", "must be a mapping with dist: lognormal (median, sigma), "
                    "uniform (min, max) or constant (value)")
    return obj


def _draw(d: dict[str, Any], where: str, rng: random.Random, bound: float) -> int:
    """One length from ``d``, every parameter at most ``bound`` (tokens), as is the draw."""
    value = _value(d, where, rng, bound)
    lo = _num(d, "min", where, float, 1, bound)
    hi = _num(d, "max", where, float, bound, bound)
    return int(max(lo, min(hi, max(1.0, round(value)))))


def _seconds(d: dict[str, Any], where: str, rng: random.Random) -> float:
    """One duration from ``d`` in seconds (>= 0, within its min and max)."""
    value = _value(d, where, rng, bounds.MAX_SPAN_S)
    lo = float(_num(d, "min", where, float, 0.0, bounds.MAX_SPAN_S))
    hi = float(_num(d, "max", where, float, bounds.MAX_SPAN_S, bounds.MAX_SPAN_S))
    return max(0.0, lo, min(hi, value))


def _mean(d: dict[str, Any], where: str, bound: float) -> float:
    """The mean of ``d`` (lognormal: its median x exp(sigma^2 / 2)), within its max."""

    def num(key: str, default: float, limit: float = bound) -> float:
        return float(_num(d, key, where, float, default, limit))

    if d["dist"] == "constant":
        mean = num("value", 1.0)
    elif d["dist"] == "uniform":
        mean = (num("min", 1.0) + num("max", 1.0)) / 2
    else:
        sigma = num("sigma", 0.0, bounds.MAX_SIGMA)
        mean = num("median", 1.0) * math.exp(sigma * sigma / 2)
    return min(num("max", bound), mean)


def _value(d: dict[str, Any], where: str, rng: random.Random, bound: float) -> float:
    """One raw draw from ``d`` (before its min and max clamp)."""
    kind = d["dist"]
    if kind == "constant":
        value = _num(d, "value", where, float, None, bound)
        if value is None:
            raise _fail(where, d, None, "field 'value' is required for dist: constant")
    elif kind == "uniform":
        lo, hi = _num(d, "min", where, float, None, bound), _num(d, "max", where, float, None, bound)
        if lo is None or hi is None or lo > hi:
            raise _fail(where, d, "min", "fields 'min' <= 'max' are required for dist: uniform")
        value = rng.uniform(lo, hi)
    else:
        median = _num(d, "median", where, float, None, bound)
        sigma = _num(d, "sigma", where, float, None, bounds.MAX_SIGMA)
        if median is None or median <= 0 or sigma is None or sigma < 0:
            raise _fail(where, d, "median", "fields 'median' > 0 and 'sigma' >= 0 are required for lognormal")
        value = rng.lognormvariate(math.log(median), sigma)
    return float(value)


def _generate(tenant: Any, where: str, rng: random.Random, duration: float,
              base: int) -> list[Request]:
    if not isinstance(tenant, dict) or not isinstance(tenant.get("name"), str):
        raise _fail(where, tenant, None, "each tenant is a mapping with a 'name'")
    name = tenant["name"]
    where = f"{where} ({name})"
    known = {"name", "rate_per_s", "prompt_tokens", "output_tokens", "cache_hit",
             "shared_prefix_tokens", "giant", "sessions"}
    _no_unknown(tenant, known, where)
    if tenant.get("sessions") is not None:
        return _sessions(tenant, where, rng, duration, base)
    rate = _num(tenant, "rate_per_s", where, float, 0.0, bounds.MAX_RATE_PER_S)
    if rate < 0:
        raise _fail(where, tenant, "rate_per_s", "field 'rate_per_s' must be >= 0")
    hit = _num(tenant, "cache_hit", where, float, 0.0, 1.0)
    if not 0.0 <= hit < 1.0:
        raise _fail(where, tenant, "cache_hit", "field 'cache_hit' must be in [0, 1)")
    shared_tokens = _num(tenant, "shared_prefix_tokens", where, int, 0, bounds.MAX_PROMPT_TOKENS)
    shared = (base, shared_tokens) if shared_tokens > 0 else None
    next_block = base + 1
    out: list[Request] = []
    streams: list[tuple[float, dict[str, Any], float]] = []
    if rate > 0:
        streams.append((rate, _dist(tenant.get("prompt_tokens"), f"{where}: prompt_tokens"), hit))
    giant = tenant.get("giant")
    if giant is not None:
        if not isinstance(giant, dict):
            raise _fail(where, tenant, "giant", "field 'giant' must be a mapping")
        per_hour = _num(giant, "rate_per_hour", f"{where}: giant", float, 0.0,
                        bounds.MAX_GIANT_RATE_PER_HOUR)
        if per_hour > 0:
            streams.append((per_hour / 3600.0,
                            _dist(giant.get("prompt_tokens"), f"{where}: giant: prompt_tokens"), 0.0))
    out_dist = _dist(tenant.get("output_tokens", {"dist": "constant", "value": 1}),
                     f"{where}: output_tokens")
    for s_idx, (lam, prompt_dist, stream_hit) in enumerate(streams):
        t = rng.expovariate(lam)
        n = 0
        while t < duration:
            prompt = _draw(prompt_dist, f"{where}: prompt_tokens", rng, bounds.MAX_PROMPT_TOKENS)
            cached = int(prompt * stream_hit)
            output = _draw(out_dist, f"{where}: output_tokens", rng, bounds.MAX_OUTPUT_TOKENS)
            rid = f"{name}-{'g' if s_idx else ''}{n}"
            req, next_block = _request(rid, name, t, prompt, cached, output, next_block,
                                       shared if s_idx == 0 else None)
            out.append(req)
            n += 1
            t += rng.expovariate(lam)
    return out


def _session_shape(tenant: dict[str, Any], where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tenant's ``sessions`` mapping checked: its turns and think-time distributions."""
    sess = tenant["sessions"]
    if not isinstance(sess, dict):
        raise _fail(where, tenant, "sessions", "field 'sessions' must be a mapping with 'turns' and 'think_s'")
    _no_unknown(sess, {"turns", "think_s"}, f"{where}: sessions")
    if "cache_hit" in tenant:
        raise _fail(where, tenant, "cache_hit", "field 'cache_hit' cannot be used with 'sessions': a "
                    "session's hits come from its earlier turns (remove cache_hit)")
    turns = _dist(sess.get("turns"), f"{where}: sessions: turns")
    think = _dist(sess.get("think_s", {"dist": "constant", "value": 0}), f"{where}: sessions: think_s")
    return turns, think


def expected_turns(tenant: dict[str, Any], where: str) -> float:
    """Mean turns per session of a tenant with ``sessions`` (1 without): what the request
    bound multiplies a session rate by."""
    if not isinstance(tenant.get("sessions"), dict) or not isinstance(tenant["sessions"].get("turns"), dict):
        return 1.0
    turns = tenant["sessions"]["turns"]
    if turns.get("dist") not in ("lognormal", "uniform", "constant"):
        return 1.0  # _dist names it when the tenant is generated
    return max(1.0, _mean(turns, f"{where}: sessions: turns", bounds.MAX_TURNS))


def _sessions(tenant: dict[str, Any], where: str, rng: random.Random, duration: float,
              base: int) -> list[Request]:  # fmt: skip
    """Multi-turn sessions: sessions start as a Poisson process at ``rate_per_s``; each has
    ``turns`` turns, ``think_s`` apart (arrival to arrival; turns past ``duration_s`` are
    not sent). Turn k's prompt is turn k-1's prompt, then turn k-1's output and the new
    ``prompt_tokens`` (one new block): its leading blocks are turn k-1's, so it hits only
    where the cache still holds them, on the engine that ran the earlier turns. Nothing is
    warm on arrival. The tenant's ``shared_prefix_tokens`` lead every session."""
    name = tenant["name"]
    rate = _num(tenant, "rate_per_s", where, float, 0.0, bounds.MAX_RATE_PER_S)
    if rate < 0:
        raise _fail(where, tenant, "rate_per_s", "field 'rate_per_s' (sessions started per second) must be >= 0")
    if tenant.get("giant") is not None:
        raise _fail(where, tenant, "giant", "field 'giant' cannot be used with 'sessions': put the giants "
                    "in a tenant of their own")
    turns_d, think_d = _session_shape(tenant, where)
    prompt_d = _dist(tenant.get("prompt_tokens"), f"{where}: prompt_tokens")
    out_d = _dist(tenant.get("output_tokens", {"dist": "constant", "value": 1}), f"{where}: output_tokens")
    shared_tokens = _num(tenant, "shared_prefix_tokens", where, int, 0, bounds.MAX_PROMPT_TOKENS)
    next_block, out = base + 1, []
    start, session = rng.expovariate(rate) if rate > 0 else math.inf, 0
    while start < duration:
        turns = _draw(turns_d, f"{where}: sessions: turns", rng, bounds.MAX_TURNS)
        blocks, sizes = ([base], [shared_tokens]) if shared_tokens > 0 else ([], [])
        at, carried = start, 0
        for k in range(turns):
            if at >= duration:
                break
            new = carried + _draw(prompt_d, f"{where}: prompt_tokens", rng, bounds.MAX_PROMPT_TOKENS)
            output = _draw(out_d, f"{where}: output_tokens", rng, bounds.MAX_OUTPUT_TOKENS)
            blocks, sizes = [*blocks, next_block], [*sizes, new]
            next_block += 1
            out.append(Request(f"{name}-s{session}-t{k}", name, at, sum(sizes), output, tuple(blocks), tuple(sizes)))
            carried = output
            at += _seconds(think_d, f"{where}: sessions: think_s", rng)
        session += 1
        start += rng.expovariate(rate)
    return out
