"""The engine simulator's command line: the patched engine's launch flags, plus its own.

``slipstream engine-sim`` takes the same arguments as ``python3 -m sglang.launch_server``
in an engine pod, so a test or the cluster runner can start it with a pod's own args. The
flags that shape scheduling are honoured; any other launch_server flag is accepted and
named once on stderr as ignored (the twin has no GPU, model or parallelism to configure).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from slipstream.api import versions
from slipstream.engine import args as engine_args
from slipstream.engine import metrics as engine_metrics
from slipstream.sim import admission, profiles

SCHEDULE_POLICIES = versions.orders(versions.NEWEST)
"""Admission orders the twin models, the newest release's (at start and at run time)."""
SIM_VERSION_ENV = "SLIPSTREAM_SIM_SGLANG_VERSION"
"""Environment variable naming the SGLang release the simulator reports (``--sglang-version``)."""


def policies_of(version: str) -> tuple[str, ...]:
    """The orders an engine of ``version`` runs: its patch's, or the newest release's for a
    release with no patch (the simulator still models the patched scheduler)."""
    return versions.PATCHED.get(versions.release(version), SCHEDULE_POLICIES)
DEFAULT_MAX_PARTIAL_PREFILLS = 8
"""The patch's ``--max-partial-prefills`` default (INTERFACES B)."""
NAMED_NOT_IGNORED = ("--model-path", "--served-model-name")
"""Read only to name the model in metrics labels and /v1/models."""


class FlagError(ValueError):
    """A bad flag value; the message names the flag and the fix."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags ``slipstream engine-sim`` understands (unknown ones are collected apart)."""
    eng = p.add_argument_group("engine flags (as sglang.launch_server with the Slipstream patch)")
    eng.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    eng.add_argument("--port", type=int, default=30000,
                     help="port (default %(default)s; 0 picks a free one and prints it)")
    eng.add_argument("--model-path", default="slipstream/engine-sim", help="names the model only")
    eng.add_argument("--served-model-name", help="model name in metrics and /v1/models")
    eng.add_argument("--chunked-prefill-size", type=int, default=8192, metavar="C",
                     help="prefill tokens per pass (default %(default)s)")
    eng.add_argument("--page-size", type=int, default=1, help="KV page size (default %(default)s)")
    eng.add_argument("--long-prefill-token-threshold", type=int, default=0, metavar="T",
                     help="most prefill tokens one request takes per pass; 0 = off (stock)")
    eng.add_argument("--long-prefill-mode", default="ceiling", help=" | ".join(admission.MODES))
    eng.add_argument("--long-prefill-reflex-hold-seconds", type=float,
                     default=admission.DEFAULT_REFLEX_HOLD_S, metavar="H",
                     help="reflex mode: passes stay capped H engine seconds after a short "
                          "request was last seen waiting (default %(default)s)")
    eng.add_argument("--schedule-policy", default="fcfs", help="fcfs | lpm | srpt")
    eng.add_argument("--srpt-aging-tokens-per-s", type=float,
                     default=admission.DEFAULT_SRPT_AGING_TOKENS_PER_S,
                     help="aging of the srpt order (default %(default)s)")
    eng.add_argument("--max-partial-prefills", type=int, default=DEFAULT_MAX_PARTIAL_PREFILLS,
                     help="most partial prefills at once (default %(default)s)")
    eng.add_argument("--tokenizer-metrics-custom-labels-header",
                     default=engine_metrics.CUSTOM_LABELS_HEADER,
                     help="HTTP header carrying metric labels as JSON (default %(default)s)")
    eng.add_argument("--tokenizer-metrics-allowed-custom-labels", nargs="+", default=[],
                     metavar="LABEL", help="labels taken from that header, e.g. tenant")
    eng.add_argument("--admin-api-key-file", metavar="PATH",
                     help=f"file holding the admin key (else env {engine_args.ADMIN_API_KEY_ENV})")
    eng.add_argument("--enable-metrics", action="store_true", help="serve /metrics")
    eng.add_argument("--max-total-tokens", type=int, default=None,
                     help="KV pool size in tokens (default: what the profile's HBM holds)")
    eng.add_argument("--context-length", type=int, default=None,
                     help="refuse prompts of this many tokens or more (default: no limit)")
    eng.add_argument("--admin-api-key", default=None,
                     help="discouraged (visible in the process list): use the file or the env")
    own = p.add_argument_group("simulator flags")
    own.add_argument("--profile", default=profiles.DEFAULT_PROFILE,
                     help="twin cost profile, built-in name or JSON file (default %(default)s)")
    own.add_argument("--time-scale", type=float, default=1.0, metavar="S",
                     help="twin seconds per wall second (default %(default)s)")
    own.add_argument("--pod-name", default="", help="name used in log lines")
    own.add_argument("--sglang-version", default=None, metavar="X.Y.Z",
                     help=f"SGLang release reported in /get_server_info and whose orders are "
                          f"accepted (default env {SIM_VERSION_ENV}, else {versions.NEWEST})")
    own.add_argument("--cache-tokens", type=int, default=None,
                     help="prefix-cache capacity in tokens (default: the twin's)")


@dataclass(frozen=True)
class SimConfig:
    """Validated settings of one simulated engine (plain data)."""

    host: str
    port: int
    model_name: str
    chunked_prefill_size: int
    page_size: int
    threshold: int
    mode: str
    schedule_policy: str
    srpt_aging_tokens_per_s: float
    reflex_hold_s: float
    max_partial_prefills: int
    labels_header: str
    allowed_labels: tuple[str, ...]
    admin_api_key: str | None
    enable_metrics: bool
    profile: str
    time_scale: float
    pod_name: str
    cache_tokens: int | None = None
    admin_api_key_file: str | None = None
    sglang_version: str = versions.NEWEST
    context_length: int | None = None
    max_total_tokens: int | None = None


def threshold_error(value: object, chunked_prefill_size: int, page_size: int) -> str | None:
    """Why ``value`` is not a valid threshold (the patch's exact words), or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            return f"long_prefill_token_threshold must be an integer, got {value!r}"
    if value < 0:
        return f"long_prefill_token_threshold must be 0 (off) or positive, got {value}"
    if value == 0:
        return None
    if chunked_prefill_size <= 0:
        return ("long_prefill_token_threshold > 0 requires chunked prefill "
                "(--chunked-prefill-size > 0)")
    page = page_size or 1
    if value % page:
        return f"long_prefill_token_threshold {value} must be a multiple of the page size {page}"
    if value > chunked_prefill_size:
        return (f"long_prefill_token_threshold {value} must be <= chunked_prefill_size "
                f"{chunked_prefill_size}")
    return None


def hold_error(value: object) -> str | None:
    """Why ``value`` is not a valid reflex hold (seconds), or None: the patch's message."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        return f"long_prefill_reflex_hold_seconds must be a finite number >= 0, got {value!r}"
    return None


def mode_error(value: object) -> str | None:
    if value not in admission.MODES:
        return f"long_prefill_mode must be one of {list(admission.MODES)}, got {value!r}"
    return None


def policy_error(value: object, version: str = versions.NEWEST) -> str | None:
    allowed = policies_of(version)
    if value not in allowed:
        return (f"schedule_policy can be switched at run time among "
                f"{list(allowed)} (SGLang {version}), got {value!r}")
    return None


def max_partials_error(value: object) -> str | None:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"max_partial_prefills must be an integer >= 1, got {value!r}"
    return None


def read_admin_key(key_file: str | None, environ: dict[str, str] | None = None,
                   argv_key: str | None = None) -> str | None:
    """The admin key: ``--admin-api-key-file`` if given, else the environment variable, else
    stock SGLang's ``--admin-api-key`` (accepted for old pod specs, with a warning)."""
    env = os.environ if environ is None else environ
    if key_file:
        try:
            key = Path(key_file).read_text().strip()
        except OSError as exc:
            raise FlagError(f"--admin-api-key-file {key_file}: cannot read ({exc.strerror})") from None
        if not key:
            raise FlagError(f"--admin-api-key-file {key_file} is empty: write the key into it")
        return key
    from_env = env.get(engine_args.ADMIN_API_KEY_ENV) or None
    if from_env is None and argv_key:
        print(f"engine-sim: warning: --admin-api-key puts the key in the process list; set "
              f"{engine_args.ADMIN_API_KEY_ENV} or --admin-api-key-file instead", file=sys.stderr)
        return argv_key
    return from_env


def config_from(ns: argparse.Namespace, environ: dict[str, str] | None = None) -> SimConfig:
    """Validate parsed flags (start-up checks of the patch, plus the simulator's own)."""
    if ns.chunked_prefill_size <= 0:
        raise FlagError("--chunked-prefill-size must be > 0 for the simulator (the twin models "
                        "chunked prefill)")
    if ns.page_size < 1:
        raise FlagError(f"--page-size must be >= 1, got {ns.page_size}")
    for err in (mode_error(ns.long_prefill_mode),
                threshold_error(ns.long_prefill_token_threshold, ns.chunked_prefill_size, ns.page_size),
                max_partials_error(ns.max_partial_prefills)):
        if err:
            raise FlagError(err)
    env = os.environ if environ is None else environ
    sglang_version = (getattr(ns, "sglang_version", None) or env.get(SIM_VERSION_ENV) or versions.NEWEST).strip()
    if not re.fullmatch(r"[0-9]+(\.[0-9]+){1,3}", sglang_version):
        raise FlagError(f"--sglang-version must be a release like {versions.NEWEST}, got {sglang_version!r}")
    if ns.schedule_policy not in policies_of(sglang_version):
        raise FlagError(f"--schedule-policy {ns.schedule_policy!r} is not an order of SGLang "
                        f"{sglang_version}: use one of {', '.join(policies_of(sglang_version))}")
    if not (ns.srpt_aging_tokens_per_s > 0 and math.isfinite(ns.srpt_aging_tokens_per_s)):
        raise FlagError(f"srpt_aging_tokens_per_s must be > 0, got {ns.srpt_aging_tokens_per_s!r}")
    if hold_error(ns.long_prefill_reflex_hold_seconds) is not None:
        raise FlagError(f"--long-prefill-reflex-hold-seconds must be a finite number >= 0, "
                        f"got {ns.long_prefill_reflex_hold_seconds!r}")
    if not (ns.time_scale > 0 and math.isfinite(ns.time_scale)):
        raise FlagError(f"--time-scale must be a number > 0 (twin seconds per wall second), "
                        f"got {ns.time_scale}")
    if not 0 <= ns.port <= 65535:
        raise FlagError(f"--port must be in 0..65535, got {ns.port}")
    if ns.max_total_tokens is not None and ns.max_total_tokens < 2:
        raise FlagError(f"--max-total-tokens must be >= 2, got {ns.max_total_tokens}")
    if ns.context_length is not None and ns.context_length < 2:
        raise FlagError(f"--context-length must be >= 2, got {ns.context_length}")
    if ns.cache_tokens is not None and ns.cache_tokens < 0:
        raise FlagError(f"--cache-tokens must be >= 0, got {ns.cache_tokens}")
    if ns.tokenizer_metrics_allowed_custom_labels and not ns.tokenizer_metrics_custom_labels_header:
        raise FlagError("set --tokenizer-metrics-custom-labels-header when setting "
                        "--tokenizer-metrics-allowed-custom-labels")
    return SimConfig(
        host=ns.host,
        port=ns.port,
        model_name=ns.served_model_name or ns.model_path,
        chunked_prefill_size=ns.chunked_prefill_size,
        page_size=ns.page_size,
        threshold=int(ns.long_prefill_token_threshold),
        mode=ns.long_prefill_mode,
        schedule_policy=ns.schedule_policy,
        srpt_aging_tokens_per_s=float(ns.srpt_aging_tokens_per_s),
        reflex_hold_s=float(ns.long_prefill_reflex_hold_seconds),
        max_partial_prefills=int(ns.max_partial_prefills),
        labels_header=ns.tokenizer_metrics_custom_labels_header,
        allowed_labels=tuple(ns.tokenizer_metrics_allowed_custom_labels),
        admin_api_key=read_admin_key(ns.admin_api_key_file, environ, ns.admin_api_key),
        enable_metrics=bool(ns.enable_metrics),
        profile=ns.profile,
        time_scale=float(ns.time_scale),
        sglang_version=sglang_version,
        pod_name=ns.pod_name,
        cache_tokens=ns.cache_tokens,
        admin_api_key_file=ns.admin_api_key_file,
        context_length=ns.context_length,
        max_total_tokens=ns.max_total_tokens,
    )


_VAR_REF = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


def expand_env(argv: list[str], environ: dict[str, str] | None = None) -> list[str]:
    """``$(VAR)`` references expanded from the environment with the kubelet's rules for a
    container's args (a pod's launch args use them for the tuned setting): ``$$`` is a
    literal ``$``, a reference to an unset variable stays as written."""
    env = os.environ if environ is None else environ

    def one(m: re.Match[str]) -> str:
        return "$" if m.group(1) is None else env.get(m.group(1), m.group(0))

    return [_VAR_REF.sub(one, arg) for arg in argv]


def parse(argv: list[str], environ: dict[str, str] | None = None) -> SimConfig:
    """A SimConfig from ``slipstream engine-sim`` arguments (for tests and tools); unknown
    launch_server flags are ignored as the command ignores them."""
    parser = argparse.ArgumentParser(prog="slipstream engine-sim", allow_abbrev=False)
    add_arguments(parser)
    ns, _ = parser.parse_known_args(expand_env(list(argv), environ))
    return config_from(ns, environ)


def ignored_flags(extra: list[str]) -> list[str]:
    """The flag names among unparsed arguments (their values dropped), for one stderr line."""
    return [a.split("=", 1)[0] for a in extra if a.startswith("-")]
