"""Observe: what the engines' metrics say, read from Prometheus, as WorkloadSnapshots.

``Observer(url, settings, clock=...).read(["ns/name", ...])`` sends one query per metric
family for every ServingDeployment together (``queries``), turns the answers into one
``slipstream.api.snapshot.WorkloadSnapshot`` per deployment (``assemble``, pure) and says
why when one is not usable. ``Observer.ttft_by_tenant(ns, name, pods, window)`` gives the
per-tenant TTFT of a pod subset for canary analysis. Nothing here raises on a bad read.
"""

from slipstream.observe.observer import Observer, ObserveSettings

__all__ = ["ObserveSettings", "Observer"]
