"""The SGLang releases Slipstream has a patch for, and what each one offers the tuner.

A ServingDeployment says which release its image holds (``spec.engine.version``, the newest
by default); the operator offers that release only the settings its patch supports, and
checks what the engines themselves report (``version`` in ``/get_server_info``). An engine
on a release with no patch, or on another release than the spec says, is never tuned:
Auto then only recommends (condition ``EngineSupported``), because a setting the engine
does not know would be refused (or, worse, mean something else) on every pod.
"""

from __future__ import annotations

from collections.abc import Iterable

PATCHED: dict[str, tuple[str, ...]] = {
    "0.5.18": ("fcfs", "lpm", "srpt"),
    "0.5.23": ("fcfs", "lpm", "srpt", "hrrn", "shortest-prefill-first"),
}
"""Release -> the admission orders (``--schedule-policy``) its patched engine runs. 0.5.23's
own ``hrrn`` and ``shortest-prefill-first`` are upstream orders; ``srpt`` is the patch's."""

SUPPORTED = tuple(PATCHED)
NEWEST = SUPPORTED[-1]
"""The default of ``spec.engine.version``: what users run today."""

UPSTREAM_ONLY_ORDERS = tuple(o for o in PATCHED[NEWEST] if o not in PATCHED[SUPPORTED[0]])
"""Orders some supported release lacks (the CRD refuses them for that release)."""

IMAGE = "slipstream-engine"
"""The engine image's name, tagged by release: ``docker build --build-arg SGLANG_VERSION=0.5.23
-t slipstream-engine:0.5.23 -f engine_image/Dockerfile engine_image``."""


def release(reported: str) -> str:
    """The release part of a reported version: ``0.5.23`` of ``0.5.23+slipstream-engine-sim``
    or of ``v0.5.23``."""
    text = reported.strip()
    text = text[1:] if text[:1] in ("v", "V") else text
    return text.split("+", 1)[0]


def orders(version: str) -> tuple[str, ...]:
    """The orders a release's patched engine runs (KeyError for a release with no patch)."""
    return PATCHED[version]


def problem(spec_version: str, reported: Iterable[tuple[str, str]]) -> tuple[str, str] | None:
    """(reason, message) when the engines may not be tuned, else None.

    ``reported`` is (pod, version) of each pod that answered; a pod that reported no
    version (an older engine simulator) is judged by the spec alone."""
    unpatched = sorted((pod, v) for pod, v in reported if v and release(v) not in PATCHED)
    if unpatched:
        listed = ", ".join(f"{pod} ({v})" for pod, v in unpatched[:8])
        return ("UnpatchedVersion",
                f"engine pod(s) {listed} run an SGLang release Slipstream has no patch for "
                f"(patched: {', '.join(SUPPORTED)}): Auto only recommends until every pod runs "
                f"a patched image ({IMAGE}:<release>, engine_image/Dockerfile) and "
                f"spec.engine.version names its release")
    other = sorted((pod, v) for pod, v in reported if v and release(v) != spec_version)
    if other:
        listed = ", ".join(f"{pod} ({v})" for pod, v in other[:8])
        return ("VersionMismatch",
                f"engine pod(s) {listed} do not run spec.engine.version {spec_version}: Auto only "
                f"recommends until spec.engine.version names the release the image holds")
    return None
