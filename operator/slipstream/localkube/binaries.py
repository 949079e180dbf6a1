"""Where the control-plane binaries live, and the check that they are there.

The binaries are built by ``scripts/build-kube.sh`` from pinned upstream Go
modules into a cache outside the repo; this module computes the same directory
so tests and the demo find them without configuration.
"""

from __future__ import annotations

import os
from pathlib import Path

K8S_VERSION = "v1.36.3"
"""The Kubernetes release of kube-apiserver, kube-controller-manager, kube-scheduler
and kubectl."""

ETCD_VERSION = "v3.6.16"
"""The etcd release (the 3.6 line that Kubernetes 1.36 is tested against)."""

HELM_VERSION = "v3.22.0"
"""The helm release used to install the chart."""

KWOK_VERSION = "v0.8.0"
"""The kwok release that simulates the nodes and runs (pretends to run) their pods."""

BIN_TAG = f"k8s-{K8S_VERSION}_etcd-{ETCD_VERSION}_helm-{HELM_VERSION}_kwok-{KWOK_VERSION}"
"""Cache sub-directory: names every version so a bump builds a fresh directory.

Must equal ``BIN_TAG`` in scripts/build-kube.sh (a cluster test checks it).
"""

BIN_DIR_ENV = "SLIPSTREAM_KUBE_BIN"
"""Environment variable that overrides the binary directory (script and library)."""

REQUIRED = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "helm",
)
"""Every binary a Cluster runs or offers."""

KWOK_STAGES = "kwok-stages.yaml"
"""kwok's default stages, which the build copies next to the binaries (kwok
itself has none built in): nodes become Ready, pods Running and Ready."""

BUILD_HINT = "run `bash scripts/build-kube.sh` (or `make kube-bins`) from the repo root"


class BinariesMissingError(FileNotFoundError):
    """Raised when the binary directory lacks a binary: the build has not run."""


def default_bin_dir() -> Path:
    """The directory scripts/build-kube.sh builds into, or ``$SLIPSTREAM_KUBE_BIN``."""
    override = os.environ.get(BIN_DIR_ENV)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "slipstream" / "bin" / BIN_TAG


def require(bin_dir: Path) -> None:
    """Fail with the build command in the message when a binary is missing.

    Checked up front so a missing build reads as one clear error instead of a
    FileNotFoundError from deep inside process start-up.
    """
    missing = [name for name in REQUIRED if not os.access(bin_dir / name, os.X_OK)]
    if not (bin_dir / KWOK_STAGES).is_file():
        missing.append(KWOK_STAGES)
    if missing:
        raise BinariesMissingError(
            f"control-plane binaries missing from {bin_dir}: {', '.join(missing)}; {BUILD_HINT}"
        )
