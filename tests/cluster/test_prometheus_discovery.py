"""Prometheus finds engine pods through the real apiserver (localkube.poddiscovery).

The local control plane's kwok hands out pod IPs inside 127.0.0.0/8, so an exporter can
listen on a pod's own IP and port: Prometheus (Debian's 2.42, polling the discovery over
``http_sd_configs``) finds the pod, labels it ``namespace``, ``pod``, ``servingdeployment``
and scrapes ``podIP:port`` of the container port named ``http``; pods without the
``serving.slipstream.dev/name`` label or without that port are left out. The observer then
reads the pod's setting gauges. Only loopback addresses are used.
"""

from __future__ import annotations

import ipaddress
import json
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, start_http_server

from conftest import eventually
from slipstream import localkube
from slipstream.api import snapshot as snap
from slipstream.engine import metrics
from slipstream.localkube import ports
from slipstream.localkube import prometheus as localprom
from slipstream.observe import Observer, ObserveSettings

NS = "observe-sd"


def pod(name: str, port: int, *, labelled: bool = True, port_name: str = "http") -> dict:
    labels = {localprom.NAME_LABEL: "chat"} if labelled else {"app": "other"}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"containers": [{"name": "engine", "image": "slipstream-engine:test",
                                 "ports": [{"name": port_name, "containerPort": port}]}]},
    }


def gauges(threshold: int, mode: str, policy: str) -> CollectorRegistry:
    """An engine's setting gauges and queue gauge, as the patched engine exports them."""
    registry = CollectorRegistry()
    Gauge(metrics.NUM_QUEUE_REQS, "queue", registry=registry).set(0)
    Gauge(metrics.LONG_PREFILL_TOKEN_THRESHOLD, "T", registry=registry).set(threshold)
    Gauge(metrics.LONG_PREFILL_MODE, "mode", ["mode"], registry=registry).labels(mode=mode).set(1)
    Gauge(metrics.SCHEDULE_POLICY, "policy", ["policy"], registry=registry).labels(policy=policy).set(1)
    return registry


def test_engine_pods_are_discovered_relabelled_and_scraped(
    cluster: localkube.Cluster, tmp_path: Path
) -> None:
    port = ports.free_ports(1)[0]
    cluster.kubectl("create", "namespace", NS)
    for doc in (pod("chat-0", port), pod("other-0", port, labelled=False),
                pod("chat-metrics-0", port, port_name="metrics")):
        cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))

    def pod_ip() -> str:
        out = cluster.kubectl("get", "pod", "chat-0", "-n", NS, "-o", "jsonpath={.status.podIP}")
        assert out.stdout.strip(), "no pod IP yet"
        return out.stdout.strip()

    ip = eventually(pod_ip, deadline_s=30, what="chat-0 gets a pod IP")
    assert ipaddress.ip_address(ip).is_loopback, ip
    server, thread = start_http_server(port, addr=ip, registry=gauges(1024, "floor", "lpm"))
    prom = localprom.PrometheusServer.start(
        tmp_path / "prometheus",
        discovery=localprom.PodDiscovery(kubeconfig=cluster.kubeconfig, namespaces=(NS,)),
    )
    try:
        prom.wait_for_targets(1, deadline_s=30)
        with urllib.request.urlopen(f"{prom.url}/api/v1/targets?state=active") as resp:
            active = json.loads(resp.read())["data"]["activeTargets"]
        assert len(active) == 1, active
        (target,) = active
        assert target["scrapeUrl"] == f"http://{ip}:{port}/metrics"
        assert {k: target["labels"][k] for k in localprom.TARGET_LABELS} == {
            "namespace": NS, "pod": "chat-0", "servingdeployment": "chat"}
        observer = Observer(prom.url, ObserveSettings(window_s=10, max_staleness_s=10))

        def idle_with_gauges() -> snap.WorkloadSnapshot:
            got = observer.read([f"{NS}/chat"])[f"{NS}/chat"]
            assert got.invalid == snap.NO_TRAFFIC, got.detail
            return got

        got = eventually(idle_with_gauges, deadline_s=15, what="the pod's gauges read")
        assert got.pods == (snap.PodSetting("chat-0", 1024, "floor", "lpm"),)
    finally:
        prom.stop()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        cluster.kubectl("delete", "namespace", NS, "--wait=false")
