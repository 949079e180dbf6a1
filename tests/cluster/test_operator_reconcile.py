"""The operator on a real control plane: the chart installed with real helm, the operator
run as a process with a token of the chart's ServiceAccount (so the chart's RBAC is what is
tested), and the examples, invalid specs, Secrets, updates, deletion and restarts.

The control plane runs the deployment and replicaset controllers, the scheduler and kwok
with simulated 8-GPU nodes: the engine Deployments get real ReplicaSets and pods, scheduled
by their GPU requests and reported Running and Ready by kwok (no container runs). Rollouts,
pods kept across in-place changes, and readiness are observed, not written by hand.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import eventually
from slipstream import localkube
from slipstream.controller.runtime import readiness
from slipstream.localkube import ports

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "slipstream"
EXAMPLES = {p.stem: p for p in sorted((ROOT / "examples").glob("*.yaml"))}
RELEASE_NS = "slipstream-system"
SA = "slipstream"  # the chart's full name for release "slipstream"
PEERING = "slipstream"
DEADLINE_S = 60


class Operator:
    """`python -m slipstream.controller` as a child process, with its own log file."""

    def __init__(
        self, cluster: localkube.Cluster, kubeconfig: Path, name: str, *args: str, env: dict[str, str] | None = None
    ) -> None:
        self.cluster, self.kubeconfig, self.name = cluster, kubeconfig, name
        self.extra_env = env or {}
        self.args = list(args) or [f"--peering={PEERING}"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = cluster.workdir / "logs" / f"operator-{name}.log"
        self.starts = 0
        self.identity = ""

    def start(self) -> None:
        health, metrics = ports.free_ports(2)
        self.health_url = f"http://127.0.0.1:{health}/healthz"
        self.metrics_url = f"http://127.0.0.1:{metrics}/metrics"
        self.starts += 1
        # kopf's identity in the peering object (POD_ID): one per process, named for the test.
        self.identity = f"{self.name}-{self.starts}-{secrets.token_hex(3)}"
        env = {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "SLIPSTREAM_RETRY_DELAY_SECONDS": "2",
            "SLIPSTREAM_STATUS_INTERVAL_SECONDS": "3",
            "SLIPSTREAM_METRICS_PORT": str(metrics),
            # Only loopback may be contacted on a test machine: engine pods elsewhere count
            # as unreachable.
            "SLIPSTREAM_ENGINE_NETWORKS": "127.0.0.0/8",
            "POD_ID": self.identity,
            **self.extra_env,
        }
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n===== start {self.starts} =====\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "slipstream.runtime_only", *self.args, f"--liveness={self.health_url}"],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
            )  # fmt: skip

        def healthy() -> None:
            assert self.proc is not None and self.proc.poll() is None, self.log_tail()
            try:
                with urllib.request.urlopen(self.health_url, timeout=2) as response:
                    assert response.status == 200
            except OSError as error:
                raise AssertionError(f"health endpoint: {error}") from error

        eventually(healthy, deadline_s=DEADLINE_S, what=f"operator {self.name} healthy")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log(self) -> str:
        """This run's log (since the last start)."""
        return self.log_path.read_text(errors="replace").rsplit("===== start", 1)[-1]

    def log_tail(self) -> str:
        return "\n".join(self.log().splitlines()[-40:])


def settled_peering(cluster: localkube.Cluster, ops: list[Operator], deadline_s: float = DEADLINE_S) -> Operator:
    """Wait until kopf let exactly one replica act, and return it. Both entries in the
    peering object are not enough: a replica pauses only once it has read the other's
    entry, and until then both may act (CI of 54363be saw both reconcile one object). The
    entry of highest priority names the replica that must have resumed; each of the others
    must be paused: its last peering line since its start is not kopf's "Resuming" (a
    replica starts paused and says nothing when its first decision keeps it so)."""
    def last_peering_line(op: Operator) -> str:
        lines = [ln for ln in op.log().splitlines() if readiness.PAUSING in ln or readiness.RESUMING in ln]
        return lines[-1] if lines else ""

    def one_active() -> Operator:
        peering = json.loads(cluster.kubectl("get", "clusterkopfpeering", PEERING, "-o", "json").stdout)
        entries = peering.get("status") or {}
        missing = [op.identity for op in ops if op.identity not in entries]
        assert not missing, f"not yet in the peering object: {missing}"
        top = max(ops, key=lambda op: int(entries[op.identity]["priority"]))
        acting = [op.name for op in ops if readiness.RESUMING in last_peering_line(op)]
        assert acting == [top.name], f"acting: {acting}; of highest priority: {top.name}"
        return top

    return eventually(one_active, deadline_s=deadline_s, what="one replica acting, the others paused by kopf")


SECRET_NAMES = ("kimi-k3-admin", "deepseek-v4-flash-admin", "engine-admin")
"""The admin-key Secrets the tests' ServingDeployments name: the chart lets the operator
read Secrets by these names only (rbac.secretNames)."""


def installed_operator(
    cluster: localkube.Cluster, name: str, env: dict[str, str] | None = None, sets: tuple[str, ...] = ()
) -> Iterator[Operator]:
    """The chart installed with helm (extra ``--set`` values in ``sets``) and the operator
    running as its ServiceAccount."""
    cluster.helm("install", "slipstream", str(CHART), f"--namespace={RELEASE_NS}", "--create-namespace",
                 f"--set=rbac.secretNames={{{','.join(SECRET_NAMES)}}}", *(f"--set={v}" for v in sets))  # fmt: skip
    cluster.kubectl(
        "wait", "--for=condition=Established", "--timeout=60s",
        "crd/servingdeployments.serving.slipstream.dev", "crd/clusterkopfpeerings.kopf.dev",
    )  # fmt: skip
    op = Operator(cluster, cluster.token_kubeconfig(RELEASE_NS, SA), name, env=env)
    op.start()
    try:
        yield op
    finally:
        op.stop()
        cluster.helm("uninstall", "slipstream", f"--namespace={RELEASE_NS}", check=False)


@pytest.fixture(scope="module")
def operator(cluster: localkube.Cluster) -> Iterator[Operator]:
    yield from installed_operator(cluster, "main")


# -- helpers ---------------------------------------------------------------------------


def namespace(cluster: localkube.Cluster, name: str) -> str:
    cluster.kubectl("create", "namespace", name)
    return name


def get(cluster: localkube.Cluster, kind: str, name: str, ns: str) -> dict[str, Any] | None:
    result = cluster.kubectl("get", kind, name, f"--namespace={ns}", "-o", "json", check=False)
    if result.returncode != 0:
        assert "NotFound" in result.stderr, result.stderr
        return None
    return json.loads(result.stdout)


def must_get(cluster: localkube.Cluster, kind: str, name: str, ns: str) -> dict[str, Any]:
    obj = get(cluster, kind, name, ns)
    assert obj is not None, f"{kind} {ns}/{name} does not exist"
    return obj


def events(cluster: localkube.Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    items = json.loads(cluster.kubectl("get", "events", f"--namespace={ns}", "-o", "json").stdout)["items"]
    return [e for e in items if e["involvedObject"]["kind"] == "ServingDeployment" and e["involvedObject"]["name"] == name]


def condition(sd: dict[str, Any], type_: str) -> dict[str, Any]:
    found = [c for c in sd.get("status", {}).get("conditions", []) if c["type"] == type_]
    assert found, f"no {type_} condition in {sd.get('status')}"
    return found[0]


def fixed_sd(name: str, **engine: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.slipstream.dev/v1alpha1",
        "kind": "ServingDeployment",
        "metadata": {"name": name},
        "spec": {
            "engine": {"image": "engine:1", "model": "org/model", "chunkedPrefillSize": 8192, "pageSize": 64,
                       **engine},
            "tuning": {"mode": "Fixed", "threshold": 4096},
        },
    }  # fmt: skip


def apply(cluster: localkube.Cluster, ns: str, *docs: dict[str, Any], check: bool = True) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("apply", f"--namespace={ns}", "-f", "-", input=yaml.safe_dump_all(docs), check=check)


def reconciled(cluster: localkube.Cluster, ns: str, name: str) -> dict[str, Any]:
    """The ServingDeployment once the operator has handled its latest generation."""
    sd = must_get(cluster, "sd", name, ns)
    assert sd.get("status", {}).get("observedGeneration") == sd["metadata"]["generation"], sd.get("status")
    return sd


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def rolled_out(cluster: localkube.Cluster, ns: str, name: str) -> dict[str, Any]:
    """The engine Deployment once its controller has rolled out its latest spec, all pods available."""
    dep = must_get(cluster, "deployment", name, ns)
    status, want = dep.get("status", {}), dep["spec"]["replicas"]
    assert status.get("observedGeneration") == dep["metadata"]["generation"], status
    counts = [status.get(key, 0) for key in ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas")]
    assert counts == [want] * 4, f"want {want} of each, got {counts}: {status}"
    progressing = {c["type"]: c.get("reason") for c in status.get("conditions", [])}.get("Progressing")
    assert progressing == "NewReplicaSetAvailable", status  # what `kubectl rollout status` waits for
    return dep


def replica_sets(cluster: localkube.Cluster, ns: str, name: str) -> dict[str, dict[str, Any]]:
    """The ReplicaSets owned by Deployment ``name``, by name."""
    items = json.loads(cluster.kubectl("get", "replicasets", f"--namespace={ns}", "-o", "json").stdout)["items"]
    return {
        rs["metadata"]["name"]: rs
        for rs in items
        if any(o["kind"] == "Deployment" and o["name"] == name for o in rs["metadata"].get("ownerReferences", []))
    }


def engine_pods(cluster: localkube.Cluster, ns: str, name: str) -> dict[str, dict[str, Any]]:
    """The engine pods of ServingDeployment ``name`` that are not being deleted, by name."""
    items = json.loads(cluster.kubectl(
        "get", "pods", f"--namespace={ns}", f"--selector=serving.slipstream.dev/name={name}", "-o", "json"
    ).stdout)["items"]  # fmt: skip
    return {p["metadata"]["name"]: p for p in items if not p["metadata"].get("deletionTimestamp")}


def pod_identities(cluster: localkube.Cluster, ns: str, name: str) -> dict[str, str]:
    """{pod name: uid} of the engine pods: equal before and after means no pod was replaced."""
    return {pod: p["metadata"]["uid"] for pod, p in engine_pods(cluster, ns, name).items()}


# -- the chart ---------------------------------------------------------------------------


def test_chart_lints_clean_and_renders_both_rbac_scopes(cluster: localkube.Cluster) -> None:
    lint = cluster.helm("lint", str(CHART), "--strict")
    assert "0 chart(s) failed" in lint.stdout, lint.stdout
    namespaced = cluster.helm(
        "template", "x", str(CHART), "--kube-version=1.36.3", "--set=watchNamespace=team-a",
        "--set=metrics.serviceMonitor.enabled=true",
    ).stdout
    kinds = [d["kind"] for d in yaml.safe_load_all(namespaced) if d]
    assert "RoleBinding" in kinds and "KopfPeering" in kinds and "ServiceMonitor" in kinds
    bad = cluster.helm("template", "x", str(CHART), "--kube-version=1.36.3", "--set=replicaCount=0", check=False)
    assert bad.returncode != 0 and "replicaCount" in bad.stderr


def test_helm_install_establishes_the_crd_and_peering(cluster: localkube.Cluster, operator: Operator) -> None:
    crd = json.loads(cluster.kubectl("get", "crd", "servingdeployments.serving.slipstream.dev", "-o", "json").stdout)
    established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert established["Established"] == "True" and established["NamesAccepted"] == "True"
    assert "sd" in crd["status"]["acceptedNames"]["shortNames"]
    dep = must_get(cluster, "deployment", "slipstream", RELEASE_NS)
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["containers"][0]["livenessProbe"]["httpGet"]["path"] == "/healthz"

    def peers() -> dict[str, Any]:
        peering = json.loads(cluster.kubectl("get", "clusterkopfpeering", PEERING, "-o", "json").stdout)
        assert peering.get("status"), "the operator has not announced itself in the peering object"
        return peering["status"]

    eventually(peers, deadline_s=DEADLINE_S, what="operator in the peering object")


def test_of_two_replicas_one_is_active(cluster: localkube.Cluster, operator: Operator) -> None:
    ns = namespace(cluster, "peering")
    second = Operator(cluster, operator.kubeconfig, "standby")
    second.start()
    try:
        def both_announced() -> None:
            peering = json.loads(cluster.kubectl("get", "clusterkopfpeering", PEERING, "-o", "json").stdout)
            assert len(peering.get("status", {})) >= 2, peering.get("status")

        eventually(both_announced, deadline_s=DEADLINE_S, what="both replicas in the peering object")
        active = settled_peering(cluster, [operator, second])
        apply(cluster, ns, fixed_sd("one"))
        eventually(lambda: reconciled(cluster, ns, "one"), deadline_s=DEADLINE_S, what="one reconciled")
        handled = [op.name for op in (operator, second) if f"{ns}/one reconciled" in op.log()]
        assert handled == [active.name], f"handled by {handled}, the replica of highest priority: {active.name}"
    finally:
        second.stop()

    # A replica that stops removes itself from the peering object, and the other takes over.
    apply(cluster, ns, fixed_sd("two"))

    def main_took_over() -> None:
        assert f"{ns}/two reconciled" in operator.log(), operator.log_tail()

    eventually(main_took_over, deadline_s=90, what="the main replica active after the other stopped")


def test_a_namespaced_install_serves_its_namespace_with_namespaced_rbac(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    team = namespace(cluster, "team-a")
    operator.stop()  # the cluster-wide operator would serve team-a too
    release = "slipstream-team-a"
    try:
        cluster.helm(
            "install", release, str(CHART), "--namespace=team-a-system", "--create-namespace",
            "--set=watchNamespace=team-a", "--set=peering.name=team-a",
        )  # fmt: skip
        token = cluster.token_kubeconfig("team-a-system", release)
        scoped = Operator(cluster, token, "team-a", "--namespace=team-a", "--peering=team-a",
                          env={"SLIPSTREAM_ADMIN_SEED_SECRET": f"team-a-system/{release}-admin-seed"})  # as the chart sets it
        scoped.start()
        try:
            apply(cluster, team, fixed_sd("scoped"))
            eventually(lambda: reconciled(cluster, team, "scoped"), deadline_s=DEADLINE_S, what="scoped reconciled")
            assert get(cluster, "deployment", "scoped", team) is not None
            peering = json.loads(cluster.kubectl("get", "kopfpeering", "team-a", f"--namespace={team}", "-o", "json").stdout)
            assert peering.get("status"), "the scoped operator is not in its KopfPeering"
            assert "Forbidden" not in scoped.log(), "the namespaced chart's RBAC is short of something"
        finally:
            scoped.stop()
        elsewhere = cluster.kubectl("get", "sd", "--namespace=default", kubeconfig=token, check=False)
        assert elsewhere.returncode != 0 and "forbidden" in elsewhere.stderr
    finally:
        cluster.helm("uninstall", release, "--namespace=team-a-system", check=False)
        operator.start()


# -- the examples --------------------------------------------------------------------------

EXPECTED = {
    # example: (name, tp, C, T, concurrency)
    "kimi-k3-8xh200": ("kimi-k3", 8, 8192, 4096, 2),
    "deepseek-v4-flash": ("deepseek-v4-flash", 8, 16384, 4096, 4),
    "llama3-70b-4xa100": ("llama3-70b", 4, 4096, 0, 1),
}
REFUSED_EXAMPLES = {
    # example: the reasons the operator may give (engine/support.py checks the model first)
    "deepseek-v4-flash": {"UnsupportedModel", "UnsupportedFeature"},
}
COLUMNS = ["NAME", "THRESHOLD", "CONCURRENCY", "MODE", "HETEROGENEITY", "PHASE", "AGE"]


def sd_table(cluster: localkube.Cluster, ns: str) -> list[list[str]]:
    return [line.split() for line in cluster.kubectl("get", "sd", f"--namespace={ns}").stdout.splitlines()]


@pytest.mark.parametrize("example", list(EXPECTED))
def test_example_gets_its_deployment_service_configmap_and_columns(
    cluster: localkube.Cluster, operator: Operator, example: str
) -> None:
    name, tp, chunk, threshold, concurrency = EXPECTED[example]
    ns = namespace(cluster, f"ex-{name}")
    doc = yaml.safe_load(EXAMPLES[example].read_text())
    key = doc["spec"]["engine"].get("adminApiKeySecretRef")
    if key:  # as the example's comment tells the user to
        cluster.kubectl("create", "secret", "generic", key["name"], "--from-literal=api-key=k3y", f"--namespace={ns}")
    cluster.kubectl("apply", f"--namespace={ns}", "-f", str(EXAMPLES[example]))

    sd = eventually(lambda: reconciled(cluster, ns, name), deadline_s=DEADLINE_S, what=f"{name} reconciled")
    if example in REFUSED_EXAMPLES:
        # DeepSeek-V4 is hybrid sliding-window (and the seed's fleet runs HiCache), which the
        # patched engine refuses with a threshold: the operator says so and starts no pods.
        cond = condition(sd, "Reconciled")
        assert cond["status"] == "False" and cond["reason"] in REFUSED_EXAMPLES[example], cond
        assert "spec." in cond["message"], cond["message"]
        assert sd["status"]["phase"] == "Degraded"
        gone = cluster.kubectl("get", "deployment", name, f"--namespace={ns}", check=False)
        assert gone.returncode != 0, gone.stdout

        # The columns show what is applied: nothing (not the spec's T and concurrency), and
        # they stay so while the tuning loop steps (SLIPSTREAM_RETRY_DELAY_SECONDS retries).
        # kubectl leaves a CRD column of an absent field blank: the row is NAME PHASE AGE.
        def columns_empty() -> list[list[str]]:
            table = sd_table(cluster, ns)
            assert table[0] == COLUMNS and table[1][:2] == [name, "Degraded"] and len(table[1]) == 3, table
            return table

        eventually(columns_empty, deadline_s=DEADLINE_S, what=f"{name}'s columns empty")
        stale = must_get(cluster, "sd", name, ns)["status"]
        assert not {"threshold", "concurrency", "mode", "schedulePolicy"} & set(stale), stale
        def stepped() -> None:
            types = {c["type"] for c in must_get(cluster, "sd", name, ns)["status"].get("conditions", [])}
            assert types & {"MetricsAvailable", "RolloutProgressing", "EnginesInSync"}, types

        eventually(stepped, deadline_s=DEADLINE_S, what="a tuning step on the refused spec (its conditions)")
        columns_empty()
        return
    assert sd["status"]["threshold"] == threshold and sd["status"]["concurrency"] == concurrency
    assert condition(sd, "Reconciled")["status"] == "True"
    assert sd["status"]["phase"] in ("Progressing", "Ready")

    dep = must_get(cluster, "deployment", name, ns)
    args = container(dep)["args"]
    assert flag(args, "--tp-size") == str(tp)
    assert flag(args, "--chunked-prefill-size") == str(chunk)
    assert flag(args, "--long-prefill-token-threshold") == "$(SLIPSTREAM_LONG_PREFILL_TOKEN_THRESHOLD)"
    assert "--enable-metrics" in args and flag(args, "--tokenizer-metrics-allowed-custom-labels") == "tenant"
    assert container(dep)["resources"]["limits"]["nvidia.com/gpu"] == str(tp)
    owner = dep["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("ServingDeployment", name, sd["metadata"]["uid"])
    managed = json.loads(cluster.kubectl(
        "get", "deployment", name, f"--namespace={ns}", "-o", "json", "--show-managed-fields"
    ).stdout)["metadata"]["managedFields"]
    # The operator only server-side applies; the Deployment controller writes status and
    # the revision annotation under its own name.
    others = {(f["manager"], f["operation"]) for f in managed} - {("kube-controller-manager", "Update")}
    assert others == {("slipstream", "Apply")}, managed
    cm = must_get(cluster, "configmap", f"{name}-engine-setting", ns)
    assert cm["data"]["threshold"] == str(threshold)
    svc = must_get(cluster, "service", name, ns)
    assert svc["spec"]["ports"][0]["port"] == 30000

    table = sd_table(cluster, ns)
    assert table[0] == COLUMNS and table[1][:4] == [name, str(threshold), str(concurrency), "ceiling"], table
    wide = cluster.kubectl("get", "sd", f"--namespace={ns}", "-o", "wide").stdout.splitlines()
    assert "TUNING" in wide[0]

    reasons = {e["reason"] for e in events(cluster, ns, name)}
    assert "Created" in reasons, reasons
    describe = cluster.kubectl("describe", "sd", name, f"--namespace={ns}").stdout
    assert "Created Deployment" in describe and "Reconciled" in describe
    with urllib.request.urlopen(operator.metrics_url, timeout=5) as response:
        assert 'slipstream_reconciles_total{result="ok"}' in response.read().decode()
    assert "Forbidden" not in operator.log(), "the chart's RBAC is short of something"

    # The engines fit the simulated GPU nodes their nodeSelector picks, and become Ready.
    def ready() -> dict[str, Any]:
        sd = must_get(cluster, "sd", name, ns)
        assert sd["status"]["phase"] == "Ready", sd["status"]
        return sd

    eventually(ready, deadline_s=DEADLINE_S, what=f"{name} engines Ready")
    dep = rolled_out(cluster, ns, name)
    pods = engine_pods(cluster, ns, name)
    assert len(pods) == dep["spec"]["replicas"]
    selector = dep["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"]
    for pod in pods.values():
        node = must_get(cluster, "node", pod["spec"]["nodeName"], "default")  # cluster-scoped
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == selector


def docs_first_example() -> tuple[str, dict[str, Any]]:
    """docs/operator.md's "A first ServingDeployment": its secret command and its spec."""
    doc = (ROOT / "docs" / "operator.md").read_text().split("## A first ServingDeployment", 1)[1]
    commands = doc.split("```bash\n", 1)[1].split("```", 1)[0]
    (secret,) = [line for line in commands.splitlines() if line.startswith("kubectl create secret")]
    spec = yaml.safe_load(doc.split("```yaml\n", 1)[1].split("```", 1)[0])
    return secret, spec


def test_the_docs_first_example_runs_as_written(cluster: localkube.Cluster, operator: Operator) -> None:
    """The first spec a reader of docs/operator.md applies is served (not refused), its
    columns show the setting its engines start with, and `kubectl explain` gives the
    loop's timings with their defaults and units."""
    secret, doc = docs_first_example()
    name = doc["metadata"]["name"]
    ns = namespace(cluster, "docs-first")
    # As written, the key's generator, $(openssl rand -hex 24), replaced by a literal.
    cluster.kubectl(*re.sub(r"\$\([^)]*\)", "k3y", secret).split()[1:], f"--namespace={ns}")
    cluster.kubectl("apply", f"--namespace={ns}", "-f", "-", input=yaml.safe_dump(doc))
    sd = eventually(lambda: reconciled(cluster, ns, name), deadline_s=DEADLINE_S, what=f"{name} reconciled")
    assert condition(sd, "Reconciled")["status"] == "True", condition(sd, "Reconciled")
    c, t = doc["spec"]["engine"]["chunkedPrefillSize"], doc["spec"]["tuning"]["threshold"]
    table = sd_table(cluster, ns)
    assert table[0] == COLUMNS and table[1][:4] == [name, str(t), str(c // t), "ceiling"], table
    assert must_get(cluster, "deployment", name, ns)["spec"]["replicas"] == doc["spec"]["replicas"]
    for field, said in (("spec.tuning.intervalSeconds", "Default 60 (seconds"),
                        ("spec.tuning.cooldownSeconds", "Default 180 (seconds"),
                        ("spec.tuning.rollout.analysisWindowSeconds", "Default 120 (seconds"),
                        ("spec.tuning.rollout.maxRegressionPercent", "Default 100 (percent")):  # fmt: skip
        explained = " ".join(cluster.kubectl("explain", f"sd.{field}").stdout.split())
        assert said in explained, explained
    cluster.kubectl("delete", "sd", name, f"--namespace={ns}", "--wait=false")


# -- the apiserver refuses invalid specs, naming the field --------------------------------

INVALID = [
    # (what, spec changes, expected in the error)
    ("threshold > C", {"tuning": {"threshold": 16384}}, "spec.tuning.threshold must be <= spec.engine.chunkedPrefillSize"),
    ("threshold not page-aligned", {"tuning": {"threshold": 4000}}, "spec.tuning.threshold must be a multiple of spec.engine.pageSize"),
    ("min > max concurrency", {"tuning": {"minConcurrency": 4, "maxConcurrency": 2}}, "spec.tuning.minConcurrency must be <= spec.tuning.maxConcurrency"),
    ("Fixed without threshold", {"tuning": {"threshold": None}}, "spec.tuning.threshold is required when spec.tuning.mode is Fixed"),
    ("Auto without Prometheus", {"tuning": {"mode": "Auto"}}, "spec.prometheus.url is required"),
    ("C not page-aligned", {"engine": {"chunkedPrefillSize": 8200}}, "spec.engine.chunkedPrefillSize must be a multiple of spec.engine.pageSize"),
    ("fewer GPUs than TP", {"engine": {"tensorParallelSize": 8, "gpus": 4}}, "spec.engine.gpus must be at least spec.engine.tensorParallelSize"),
    ("HiCache ratio and size", {"engine": {"hicache": {"enabled": True, "ratio": 2, "sizeGB": 100}}}, "set only one of ratio or sizeGB"),
    ("max concurrency beyond pages", {"engine": {"chunkedPrefillSize": 128}, "tuning": {"threshold": 64, "maxConcurrency": 4}}, "spec.tuning.maxConcurrency must be <="),
    ("canaries beyond replicas", {"replicas": 1, "tuning": {"mode": "Auto", "rollout": {"canaryReplicas": 2}}, "prometheus": {"url": "http://p:9090"}}, "spec.tuning.rollout.canaryReplicas must be <= spec.replicas"),
    ("env value and Secret", {"engine": {"env": [{"name": "A", "value": "1", "secretKeyRef": {"name": "s"}}]}}, "spec.engine.env: an entry takes value or secretKeyRef, not both"),
    ("negative replicas", {"replicas": -1}, "spec.replicas"),
    ("TP 0", {"engine": {"tensorParallelSize": 0}}, "spec.engine.tensorParallelSize"),
    ("C too small", {"engine": {"chunkedPrefillSize": 32}}, "spec.engine.chunkedPrefillSize"),
    ("negative threshold", {"tuning": {"threshold": -64}}, "spec.tuning.threshold"),
    ("max concurrency bound", {"tuning": {"maxConcurrency": 1000}}, "spec.tuning.maxConcurrency"),
    ("zero TTFT target", {"tuning": {"objective": {"ttftP99Seconds": 0}}}, "spec.tuning.objective.ttftP99Seconds"),
    ("unknown mode", {"tuning": {"mode": "Sometimes"}}, "spec.tuning.mode"),
    ("unknown engine mode", {"tuning": {"engineMode": "middle"}}, "spec.tuning.engineMode"),
    ("port bound", {"engine": {"port": 70000}}, "spec.engine.port"),
    ("bad Prometheus URL", {"prometheus": {"url": "prometheus:9090"}}, "spec.prometheus.url"),
    ("replicas as text", {"replicas": "two"}, "spec.replicas"),
    ("C as text", {"engine": {"chunkedPrefillSize": "big"}}, "spec.engine.chunkedPrefillSize"),
    ("boolean as text", {"engine": {"hicache": {"enabled": "yes"}}}, "spec.engine.hicache.enabled"),
    ("list as text", {"engine": {"extraArgs": "--disable-cuda-graph"}}, "spec.engine.extraArgs"),
    ("no image", {"engine": {"image": None}}, "spec.engine.image"),
    ("unknown field", {"engine": {"imagee": "typo"}}, "spec.engine.imagee"),
    ("0.5.23's order on 0.5.18", {"engine": {"version": "0.5.18"}, "tuning": {"schedulePolicy": "hrrn"}}, "spec.tuning.schedulePolicy hrrn and shortest-prefill-first are SGLang 0.5.23's orders"),
    ("0.5.23's orders to tune on 0.5.18", {"engine": {"version": "0.5.18"}, "tuning": {"orders": ["srpt", "shortest-prefill-first"]}}, "spec.tuning.orders: hrrn and shortest-prefill-first are SGLang 0.5.23's orders"),
    ("unpatched release", {"engine": {"version": "0.5.24"}}, "spec.engine.version"),
]


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def test_the_valid_base_of_the_invalid_specs_is_accepted(cluster: localkube.Cluster, operator: Operator) -> None:
    result = cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "--namespace=default", "-f", "-",
        input=yaml.safe_dump(fixed_sd("base")), check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("what", "changes", "expected"), INVALID, ids=[case[0] for case in INVALID])
def test_invalid_spec_is_refused_naming_the_field(
    cluster: localkube.Cluster, operator: Operator, what: str, changes: dict[str, Any], expected: str
) -> None:
    doc = fixed_sd("invalid")
    doc["spec"] = merged(doc["spec"], changes)
    result = cluster.kubectl(
        "apply", "--dry-run=server", "--validate=strict", "--namespace=default", "-f", "-",
        input=yaml.safe_dump(doc), check=False,
    )  # fmt: skip
    assert result.returncode != 0, f"{what}: accepted"
    assert expected in result.stderr, result.stderr


# -- a missing Secret ------------------------------------------------------------------------


def test_missing_secret_gives_a_condition_and_event_and_others_are_served(
    cluster: localkube.Cluster, operator: Operator
) -> None:
    ns = namespace(cluster, "secret-missing")
    broken = fixed_sd("needs-key", adminApiKeySecretRef={"name": "engine-admin"})
    apply(cluster, ns, broken, fixed_sd("fine"))

    def degraded() -> dict[str, Any]:
        sd = must_get(cluster, "sd", "needs-key", ns)
        assert sd.get("status", {}).get("phase") == "Degraded", sd.get("status")
        return sd

    sd = eventually(degraded, deadline_s=DEADLINE_S, what="needs-key degraded")
    reconciled_ = condition(sd, "Reconciled")
    assert reconciled_["status"] == "False" and reconciled_["reason"] == "AdminKeySecretMissing"
    assert "engine-admin" in reconciled_["message"] and "kubectl create secret" in reconciled_["message"]
    warnings = [e for e in events(cluster, ns, "needs-key") if e["type"] == "Warning"]
    assert any(e["reason"] == "AdminKeySecretMissing" for e in warnings), warnings
    assert get(cluster, "deployment", "needs-key", ns) is None

    eventually(lambda: reconciled(cluster, ns, "fine"), deadline_s=DEADLINE_S, what="fine reconciled")
    assert get(cluster, "deployment", "fine", ns) is not None

    cluster.kubectl("create", "secret", "generic", "engine-admin", "--from-literal=api-key=s3cret", f"--namespace={ns}")

    def recovered() -> None:
        sd = must_get(cluster, "sd", "needs-key", ns)
        assert condition(sd, "Reconciled")["status"] == "True"
        assert sd["status"]["phase"] != "Degraded"
        dep = must_get(cluster, "deployment", "needs-key", ns)
        env = {e["name"]: e for e in container(dep)["env"]}
        assert env["SLIPSTREAM_ADMIN_API_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "engine-admin"

    eventually(recovered, deadline_s=DEADLINE_S, what="needs-key recovered after the Secret appeared")


# -- updates -----------------------------------------------------------------------------------


# A change of the setting (a Fixed edit, Auto's own moves) reaches the running engines in
# place through their admin API, and status shows what they then report: see
# tests/cluster/test_rollout.py, which runs engines that answer.


def test_spec_change_needing_new_pods_rolls_the_deployment(cluster: localkube.Cluster, operator: Operator) -> None:
    ns = namespace(cluster, "rolling")
    apply(cluster, ns, fixed_sd("llama"))
    eventually(lambda: reconciled(cluster, ns, "llama"), deadline_s=DEADLINE_S, what="llama reconciled")
    before = eventually(lambda: rolled_out(cluster, ns, "llama"), deadline_s=DEADLINE_S, what="llama rolled out")
    (old_set,) = replica_sets(cluster, ns, "llama")
    old_pods = pod_identities(cluster, ns, "llama")

    cluster.kubectl("patch", "sd", "llama", f"--namespace={ns}", "--type=merge", "-p",
                    '{"spec":{"engine":{"image":"engine:2","tensorParallelSize":4}}}')  # fmt: skip

    def rolled() -> dict[str, Any]:
        reconciled(cluster, ns, "llama")
        dep = must_get(cluster, "deployment", "llama", ns)
        assert container(dep)["image"] == "engine:2"
        return dep

    after = eventually(rolled, deadline_s=DEADLINE_S, what="new image in the pod template")
    assert after["metadata"]["generation"] == before["metadata"]["generation"] + 1
    assert flag(container(after)["args"], "--tp-size") == "4"
    assert after["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}

    # The Deployment controller rolls it: a new ReplicaSet with the new template takes over,
    # the old one is scaled to zero, and new pods (4 GPUs each) replace the old ones.
    def new_set_took_over() -> tuple[dict[str, Any], dict[str, Any]]:
        rolled_out(cluster, ns, "llama")
        sets = replica_sets(cluster, ns, "llama")
        assert set(sets) - {old_set}, f"no new ReplicaSet yet: {sorted(sets)}"
        (new_name,) = set(sets) - {old_set}
        old, new = sets[old_set], sets[new_name]
        assert (old["spec"]["replicas"], old["status"].get("replicas", 0)) == (0, 0), old["status"]
        assert new["status"].get("readyReplicas") == new["spec"]["replicas"] == 1, new["status"]
        pods = engine_pods(cluster, ns, "llama")
        assert set(pods).isdisjoint(old_pods), f"old pods still there: {sorted(pods)}"
        return new, pods

    new, pods = eventually(new_set_took_over, deadline_s=DEADLINE_S, what="the new ReplicaSet rolled out")
    assert container(new)["image"] == "engine:2" and flag(container(new)["args"], "--tp-size") == "4"
    assert container(new)["resources"]["limits"]["nvidia.com/gpu"] == "4"
    (pod,) = pods.values()
    assert pod["metadata"]["ownerReferences"][0]["name"] == new["metadata"]["name"]
    assert pod["spec"]["containers"][0]["image"] == "engine:2" and pod["status"]["phase"] == "Running"
    assert pod["metadata"]["uid"] not in old_pods.values()
    messages = [e["message"] for e in events(cluster, ns, "llama") if e["reason"] == "Updated"]
    assert any("rolling the engine pods" in m for m in messages), messages


def test_phase_follows_the_engine_deployment(cluster: localkube.Cluster, operator: Operator) -> None:
    """The engine Deployment becomes Available on its own (kwok runs its pod); the phase follows."""
    ns = namespace(cluster, "readiness")
    apply(cluster, ns, fixed_sd("engines"))
    eventually(lambda: reconciled(cluster, ns, "engines"), deadline_s=DEADLINE_S, what="engines reconciled")
    dep = eventually(lambda: rolled_out(cluster, ns, "engines"), deadline_s=DEADLINE_S, what="engines available")
    available = {c["type"]: c["status"] for c in dep["status"]["conditions"]}
    assert available["Available"] == "True", dep["status"]

    def ready() -> dict[str, Any]:
        sd = must_get(cluster, "sd", "engines", ns)
        assert sd["status"]["phase"] == "Ready", sd["status"]
        return sd

    sd = eventually(ready, deadline_s=DEADLINE_S, what="phase Ready")
    assert sd["status"]["readyReplicas"] == 1 and condition(sd, "Ready")["reason"] == "Available"
    assert "EnginesReady" in {e["reason"] for e in events(cluster, ns, "engines")}
    row = cluster.kubectl("get", "sd", "engines", f"--namespace={ns}").stdout.splitlines()[1]
    assert row.split()[:4] == ["engines", "4096", "2", "ceiling"] and " Ready " in row


# -- a PodMonitor when Prometheus Operator is installed ----------------------------------------

POD_MONITOR_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: podmonitors.monitoring.coreos.com}
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: PodMonitor, plural: podmonitors, singular: podmonitor, listKind: PodMonitorList}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"""


def test_pod_monitor_only_when_its_crd_exists(cluster: localkube.Cluster, operator: Operator) -> None:
    ns = namespace(cluster, "monitoring")
    apply(cluster, ns, fixed_sd("before"))
    eventually(lambda: reconciled(cluster, ns, "before"), deadline_s=DEADLINE_S, what="before reconciled")
    assert cluster.kubectl("api-resources", "--api-group=monitoring.coreos.com").stdout.count("\n") <= 1

    cluster.kubectl("apply", "-f", "-", input=POD_MONITOR_CRD)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/podmonitors.monitoring.coreos.com")
    try:
        apply(cluster, ns, fixed_sd("after"))

        def monitored() -> dict[str, Any]:
            reconciled(cluster, ns, "after")
            return must_get(cluster, "podmonitor", "after", ns)

        pm = eventually(monitored, deadline_s=DEADLINE_S, what="PodMonitor created")
        assert pm["spec"]["selector"]["matchLabels"] == {"serving.slipstream.dev/name": "after"}
        assert pm["metadata"]["ownerReferences"][0]["name"] == "after"
    finally:
        cluster.kubectl("delete", "crd", "podmonitors.monitoring.coreos.com", "--wait=false")


# -- deletion and restart ------------------------------------------------------------------------


def test_delete_garbage_collects_the_owned_objects(cluster: localkube.Cluster, operator: Operator) -> None:
    ns = namespace(cluster, "deletion")
    apply(cluster, ns, fixed_sd("doomed"))
    eventually(lambda: reconciled(cluster, ns, "doomed"), deadline_s=DEADLINE_S, what="doomed reconciled")
    owned = [("deployment", "doomed"), ("service", "doomed"), ("configmap", "doomed-engine-setting")]
    assert all(get(cluster, kind, name, ns) for kind, name in owned)

    cluster.kubectl("delete", "sd", "doomed", f"--namespace={ns}", "--timeout=60s")

    def collected() -> None:
        left = [f"{kind}/{name}" for kind, name in owned if get(cluster, kind, name, ns) is not None]
        assert not left, f"still there: {left}"

    eventually(collected, deadline_s=DEADLINE_S, what="owned objects garbage-collected")


def test_operator_restart_changes_nothing_that_was_right(cluster: localkube.Cluster, operator: Operator) -> None:
    ns = namespace(cluster, "restart")
    apply(cluster, ns, fixed_sd("steady"))
    eventually(lambda: reconciled(cluster, ns, "steady"), deadline_s=DEADLINE_S, what="steady reconciled")

    def settled() -> dict[str, Any]:
        # Compare from the steady state: the engines Ready, so neither the Deployment
        # controller nor the operator's readiness update changes anything afterwards.
        rolled_out(cluster, ns, "steady")
        sd = reconciled(cluster, ns, "steady")
        assert sd["status"]["phase"] == "Ready", sd["status"]
        assert "EnginesReady" in {e["reason"] for e in events(cluster, ns, "steady")}
        # ...and the tuning loop has written its first status (and its one Warning: these
        # kwok pods run no engine to reach).
        assert {c["type"] for c in sd["status"]["conditions"]} >= {"RolloutProgressing", "EnginesInSync"}
        assert "PodsUnreachable" in {e["reason"] for e in events(cluster, ns, "steady")}
        return sd

    sd = eventually(settled, deadline_s=DEADLINE_S, what="steady engines Ready")
    pods = pod_identities(cluster, ns, "steady")
    owned = [("deployment", "steady"), ("service", "steady"), ("configmap", "steady-engine-setting")]
    versions = {kind: must_get(cluster, kind, name, ns)["metadata"]["resourceVersion"] for kind, name in owned}
    seen_events = len(events(cluster, ns, "steady"))

    operator.stop()
    operator.start()

    def resumed() -> None:
        assert f"{ns}/steady reconciled: 0 object(s) changed" in operator.log(), operator.log_tail()

    eventually(resumed, deadline_s=DEADLINE_S, what="resume handler ran")
    assert {kind: must_get(cluster, kind, name, ns)["metadata"]["resourceVersion"] for kind, name in owned} == versions
    again = must_get(cluster, "sd", "steady", ns)
    assert again["status"] == sd["status"]
    assert again["metadata"]["generation"] == sd["metadata"]["generation"]
    assert len(events(cluster, ns, "steady")) == seen_events
    assert pod_identities(cluster, ns, "steady") == pods
