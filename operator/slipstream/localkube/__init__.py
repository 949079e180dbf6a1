"""A local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler) with kwok-simulated GPU nodes that run pods without containers.

Used by the cluster tests and the demo. The binaries come from
``scripts/build-kube.sh``; ``Cluster.start(workdir)`` runs them on loopback
ports with a throw-away CA, RBAC and service-account tokens, and registers the
nodes of ``nodes.DEFAULT_POOLS``.
"""

from slipstream.localkube.binaries import BinariesMissingError, default_bin_dir
from slipstream.localkube.cluster import Cluster, CommandError
from slipstream.localkube.nodes import NodePool
from slipstream.localkube.processes import ComponentError

__all__ = [
    "BinariesMissingError",
    "Cluster",
    "CommandError",
    "ComponentError",
    "NodePool",
    "default_bin_dir",
]
