"""The simulated GPU nodes that kwok keeps Ready and runs pods on.

Each node looks like one 8-GPU serving machine, labelled with its GPU product as
GPU feature discovery labels real ones: enough CPU, memory and ``nvidia.com/gpu``
for the largest example (Kimi K3: TP 8, 64 CPUs, 1.5 TiB) to fit on one node,
and enough nodes for every example the tests apply at once, with room left for
the one-GPU engines of the other tests. No taints: pods need no toleration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slipstream.localkube.components import KWOK_NODE_ANNOTATION

GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource the NVIDIA device plugin advertises (the operator's default)."""

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
"""Label GPU feature discovery puts on a node; the examples select nodes by it."""

GPUS_PER_NODE = 8


@dataclass(frozen=True)
class NodePool:
    """``count`` identical 8-GPU nodes named ``<prefix>0``, ``<prefix>1``, ..."""

    prefix: str
    count: int
    gpu_product: str
    cpu: str
    memory: str

    def names(self) -> list[str]:
        return [f"{self.prefix}{i}" for i in range(self.count)]


DEFAULT_POOLS = (
    NodePool("kwok-h200-", 8, "NVIDIA-H200", cpu="224", memory="2Ti"),
    NodePool("kwok-a100-", 3, "NVIDIA-A100-SXM4-80GB", cpu="96", memory="1152Gi"),
)
"""The nodes a cluster starts with, shaped like 8xH200 and 8xA100 (p4de) hosts.

The examples select their GPU by product: Kimi K3 (2 pods x 8 H200) and DeepSeek
(1 x 8 H200) need three whole H200 nodes, Llama 70B (3 pods x 4 A100) at least
4 free GPUs on each of three A100 nodes (or 8 on one). The other cluster tests'
one-GPU engines select nothing, and the scheduler places them by its scores,
which favour the larger H200 hosts: with 8 H200 nodes, three stay whole for the
examples even if five such engines land on five different H200 nodes first
(three are applied before the examples today)."""

NODE_COUNT = sum(pool.count for pool in DEFAULT_POOLS)
"""Number of nodes in DEFAULT_POOLS."""


def names(pools: Sequence[NodePool]) -> list[str]:
    """Names of every node of ``pools``, pool by pool."""
    return [name for pool in pools for name in pool.names()]


def manifests(pools: Sequence[NodePool]) -> list[dict[str, Any]]:
    """Node objects of every node of ``pools``."""
    return [manifest(name, pool) for pool in pools for name in pool.names()]


def manifest(name: str, pool: NodePool) -> dict[str, Any]:
    """A Node object for kwok to manage.

    The apiserver keeps a Node's status on create (nodes register themselves
    that way), so capacity and allocatable are set here; kwok's node-initialize
    stage keeps them and adds the Ready condition, addresses and node info.
    """
    key, value = KWOK_NODE_ANNOTATION
    capacity = {
        "cpu": pool.cpu,
        "memory": pool.memory,
        "ephemeral-storage": "30Ti",
        "pods": "110",
        GPU_RESOURCE: str(GPUS_PER_NODE),
    }
    labels = {
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "type": "kwok",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.count": str(GPUS_PER_NODE),
        GPU_PRODUCT_LABEL: pool.gpu_product,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {key: value},
            "labels": labels,
        },
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def list_manifest(pools: Sequence[NodePool]) -> dict[str, Any]:
    """A v1 List of the nodes of ``pools``, to create in one kubectl call."""
    return {"apiVersion": "v1", "kind": "List", "items": manifests(pools)}


def not_schedulable(node_list: dict[str, Any], expected: list[str]) -> list[str]:
    """Names in ``expected`` missing from ``node_list``, not Ready, or still tainted; sorted.

    A new node carries the not-ready taint until the node lifecycle controller
    sees it Ready: pods can land on a node only once both have happened.
    """
    usable = set()
    for node in node_list.get("items", []):
        conditions = node.get("status", {}).get("conditions", [])
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        if ready and not node.get("spec", {}).get("taints"):
            usable.add(node["metadata"]["name"])
    return sorted(set(expected) - usable)
