"""Command lines of etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok.

Kept apart from the start-up sequence so the flags of each component can be
read (and reviewed) in one place, each with the reason it is set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from slipstream.localkube import binaries, pki
from slipstream.localkube.ports import LOOPBACK

SERVICE_CIDR = "10.0.0.0/16"
"""Service cluster-IP range; only allocated from, never routed (the nodes are simulated).
A /16: the scale benchmark's 500 ServingDeployments need 500 Services, and a /24 holds 254."""


KWOK_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
"""Annotation marking the nodes kwok manages (the kwok documentation's convention):
kwok leaves any other node alone."""

KWOK_LEASE_DURATION_S = 40
"""Node lease duration kwok renews (kubelet's default, and kwokctl's)."""

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
"""Issuer (and default audience) of service-account tokens, as on a real cluster."""

APISERVER_HOSTS = (
    LOOPBACK,
    "localhost",
    "10.0.0.1",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
"""SANs of the apiserver's serving certificate: the loopback URL plus the names
in-cluster clients use, so a kubeconfig with any of them verifies."""

FRONT_PROXY_CLIENT = "front-proxy-client"
"""CN of the certificate the apiserver presents when proxying to aggregated APIs."""

CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "node-lifecycle-controller",
    "serviceaccount-token-controller",
    "serviceaccount-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "horizontal-pod-autoscaler-controller",
)
"""Controllers the controller manager runs. The deployment and replicaset
controllers turn the operator's Deployments into ReplicaSets and pods, which
kube-scheduler binds to kwok's simulated nodes and kwok reports Running and
Ready: rollouts and readiness are observed, not written by hand. The horizontal pod
autoscaler controller is there so that a real HPA can contend with the operator for an
engine Deployment's replicas (with no metrics API here it still enforces minReplicas and
maxReplicas, which is what the fault test uses). The node
lifecycle controller lifts the ``node.kubernetes.io/not-ready`` taint that the
apiserver's TaintNodesByCondition admission puts on every new node, once kwok
reports the node Ready (as on a real cluster; without it no pod schedules), and
watches kwok's node leases. Owner-reference
garbage collection, namespace deletion and service-account tokens are what tests
rely on too; the ``default`` ServiceAccount, kube-root-ca.crt and the aggregated
admin/edit/view roles make namespaces look like a real cluster's. The other
workload controllers (StatefulSet, Job, DaemonSet, ...) and the endpoint,
taint-eviction and pod-GC controllers are left out: nothing here uses them, and each
one is informers and CPU on a two-core machine."""


@dataclass(frozen=True)
class Ports:
    """Loopback ports of one cluster."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int


@dataclass(frozen=True)
class Certs:
    """Every certificate and key file the components read."""

    ca: pki.KeyPair
    apiserver: pki.KeyPair
    front_proxy_client: pki.KeyPair
    controller_manager_serving: pki.KeyPair
    scheduler_serving: pki.KeyPair
    service_account: pki.KeyPair


def etcd(bin_dir: Path, data_dir: Path, ports: Ports) -> list[str]:
    """A single-member etcd on plain HTTP over loopback (envtest does the same)."""
    client = f"http://{LOOPBACK}:{ports.etcd_client}"
    peer = f"http://{LOOPBACK}:{ports.etcd_peer}"
    return [
        str(bin_dir / "etcd"),
        "--name=localkube",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=localkube={peer}",
        "--initial-cluster-state=new",
        # Test data is thrown away with the workdir: skipping fsync makes every
        # write several times faster on CI disks.
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def apiserver(bin_dir: Path, cert_dir: Path, certs: Certs, ports: Ports) -> list[str]:
    """kube-apiserver with client-certificate and token authentication and RBAC."""
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://{LOOPBACK}:{ports.etcd_client}",
        f"--bind-address={LOOPBACK}",
        f"--advertise-address={LOOPBACK}",
        f"--secure-port={ports.apiserver}",
        f"--cert-dir={cert_dir}",
        f"--tls-cert-file={certs.apiserver.cert}",
        f"--tls-private-key-file={certs.apiserver.key}",
        f"--client-ca-file={certs.ca.cert}",
        # Node is harmless without nodes and keeps the production mode string.
        "--authorization-mode=Node,RBAC",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={certs.service_account.cert}",
        f"--service-account-signing-key-file={certs.service_account.key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        # The reconciler would publish 127.0.0.1 as the endpoint of the
        # `kubernetes` Service, which validation rejects (loopback), logging an
        # error every 10 s; with no pods nothing reads that endpoint anyway.
        "--endpoint-reconciler-type=none",
        # Front-proxy (aggregation layer) identity: lets aggregated API servers
        # authenticate proxied requests, and gives the controller manager's
        # delegated authentication the request-header CA it otherwise keeps
        # reporting as missing.
        f"--requestheader-client-ca-file={certs.ca.cert}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={certs.front_proxy_client.cert}",
        f"--proxy-client-key-file={certs.front_proxy_client.key}",
        "--profiling=false",
        "--v=1",
    ]


HPA_SYNC_S = 5
"""kube-controller-manager's HorizontalPodAutoscaler sync period (its default is 15 s): a
local cluster's tests wait on its syncs, and a 5 s one costs nothing at this size."""


def controller_manager(bin_dir: Path, kubeconfig: Path, certs: Certs, ports: Ports) -> list[str]:
    """kube-controller-manager running CONTROLLERS, as kubeadm configures it."""
    return [
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={ports.controller_manager}",
        f"--tls-cert-file={certs.controller_manager_serving.cert}",
        f"--tls-private-key-file={certs.controller_manager_serving.key}",
        f"--controllers={','.join(CONTROLLERS)}",
        # One controller manager per cluster: leader election only adds a
        # lease round-trip before the controllers start.
        "--leader-elect=false",
        # Each controller acts as its own ServiceAccount under RBAC (kubeadm's
        # setting), so RBAC is exercised as on a real cluster.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={certs.service_account.key}",
        f"--root-ca-file={certs.ca.cert}",
        f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_S}s",
        "--v=1",
    ]


def scheduler_config(kubeconfig: Path) -> str:
    """KubeSchedulerConfiguration (JSON) for scheduler(): its kubeconfig, no leader election.

    The config file is the supported way; the ``--kubeconfig``/``--leader-elect``
    flags are deprecated in kube-scheduler.
    """
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        # One scheduler per cluster, as for the controller manager.
        "leaderElection": {"leaderElect": False},
    }
    return json.dumps(config, indent=2) + "\n"


def scheduler(
    bin_dir: Path, config: Path, kubeconfig: Path, certs: Certs, ports: Ports
) -> list[str]:
    """kube-scheduler with its default plugins, serving /readyz on loopback."""
    return [
        str(bin_dir / "kube-scheduler"),
        f"--config={config}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={ports.scheduler}",
        f"--tls-cert-file={certs.scheduler_serving.cert}",
        f"--tls-private-key-file={certs.scheduler_serving.key}",
        "--v=1",
    ]


def kwok(bin_dir: Path, kubeconfig: Path, ports: Ports, pod_cidr: str) -> list[str]:
    """kwok as a controller against this apiserver, simulating the annotated nodes.

    kwok acts as the kubelet of every node carrying KWOK_NODE_ANNOTATION: it
    keeps the node Ready (status and lease heartbeats) and moves the pods bound
    to it through the stages in ``kwok-stages.yaml`` (kwok's defaults: Running
    and Ready at once, deleted when asked), without running any container.
    Pod IPs come from ``pod_cidr``, a loopback range of this cluster's own (see
    localkube.podcidr), so an engine simulator can serve on its pod's IP.
    """
    key, value = KWOK_NODE_ANNOTATION
    return [
        str(bin_dir / "kwok"),
        f"--kubeconfig={kubeconfig}",
        f"--config={bin_dir / binaries.KWOK_STAGES}",
        f"--manage-nodes-with-annotation-selector={key}={value}",
        f"--node-lease-duration-seconds={KWOK_LEASE_DURATION_S}",
        f"--cidr={pod_cidr}",
        # Plain HTTP on loopback: /healthz for the start-up poll, nothing else.
        f"--server-address={LOOPBACK}:{ports.kwok}",
        # At INFO kwok logs every lease renewal of every node (one line per node
        # every 10 s); warnings and errors are what a failed test needs.
        "--v=WARN",
    ]
