"""Entry point of the operator: `python -m slipstream.controller` or `slipstream run`."""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence

import kopf
import prometheus_client

from slipstream.controller import handlers, settings
from slipstream.controller.clients import kube
from slipstream.controller.runtime import malloc, readiness


def run(namespaces: Sequence[str], peering: str | None, liveness: str | None) -> None:
    """Run the operator until it is stopped.

    namespaces: watch only these namespaces (empty: the whole cluster); the chart's
      watchNamespaces, given as one --namespace each.
    peering: name of the kopf peering object shared by the replicas (a ClusterKopfPeering,
      or a KopfPeering in each of `namespaces`); of the replicas sharing it, one is active
      and the others stand by. None: run alone, without peering.
    liveness: kopf's health endpoint, e.g. http://0.0.0.0:8080/healthz.
    """
    config = settings.ControllerSettings.from_env()
    malloc.configure(config.malloc_arenas, config.malloc_mmap_threshold_bytes)  # before any thread of ours starts
    malloc.collect_cycles_every(config.gc_interval_seconds)
    registry = kopf.OperatorRegistry()
    handlers.register(registry, config, kube.Kube.default(pool=max(config.api_connections, config.worker_threads)))
    serving = readiness.Serving(peering=peering is not None)
    readiness.watch_peering(serving)

    async def started(**_: object) -> None:
        serving.mark_started()

    kopf.on.startup(id="readiness", registry=registry)(started)
    if config.metrics_port:
        prometheus_client.start_http_server(config.metrics_port, addr=config.listen_address)
    if config.ready_port:
        readiness.serve(serving, config.listen_address, config.ready_port)
    kopf.configure(verbose=False)
    kopf.run(
        registry=registry,
        clusterwide=not namespaces,
        namespaces=list(namespaces),
        standalone=peering is None,
        peering_name=peering,
        # Replicas share one peering object; kopf pauses every replica but the one of
        # highest priority, so each process draws its own.
        priority=random.SystemRandom().randrange(1, 2**31),
        liveness_endpoint=liveness,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m slipstream.controller", description=run.__doc__)
    parser.add_argument("--namespace", action="append", default=[], dest="namespaces",
                        help="watch only this namespace; repeat for several (default: all)")  # fmt: skip
    parser.add_argument("--peering", help="kopf peering object name (default: standalone)")
    parser.add_argument("--liveness", help="health endpoint URL, e.g. http://0.0.0.0:8080/healthz")
    args = parser.parse_args(argv)
    run(args.namespaces, args.peering, args.liveness)
