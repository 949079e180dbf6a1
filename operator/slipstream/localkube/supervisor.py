"""``slipstream cluster up | down | status | restart``: a local stack that outlives the command.

How nothing is orphaned:

- ``up`` starts a supervisor process (``python -m slipstream.localkube.supervisor``)
  in a session of its own and waits until it reports the stack ready in the
  state file ``<workdir>/state.json`` (or failed, with its log tail). The
  supervisor owns the stack (localkube.stack): control plane, Prometheus, the
  chart and the operator, the engine-pod runner and its simulators, each in a
  process group of its own whose id it records in the state file.
- Each second the supervisor reaps and restarts any component that has died, after a
  kubelet-like backoff (localkube.restarts), and rewrites the state file with one
  record per component; ``status`` prints them, checked against the processes now,
  and exits 1 when one is down; ``restart NAME`` leaves a request file that the next
  pass takes.
- SIGTERM, SIGINT or SIGHUP to the supervisor stops the whole stack in
  reverse order and removes the state file. A Ctrl-C (or SIGTERM) of ``up``
  while it waits stops the supervisor the same way before ``up`` exits;
  ``up --foreground`` runs the supervisor in the terminal instead, until
  Ctrl-C.
- ``down`` sends the supervisor SIGTERM and waits for it; if it is gone
  (killed with SIGKILL, say) ``down`` kills every process group recorded in the
  state file itself. So ``down`` always ends with nothing running.

The default workdir is ``~/.cache/slipstream/cluster`` (``--workdir`` for
another; two workdirs are two independent clusters, with distinct ports and
pod CIDRs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from slipstream.localkube import processes, restarts

if TYPE_CHECKING:  # the stack (and its crypto) is imported only by the commands that run it
    from slipstream.localkube import stack as stack_mod

log = logging.getLogger(__name__)

DEFAULT_WORKDIR = Path.home() / ".cache" / "slipstream" / "cluster"
STATE = "state.json"
SUPERVISOR_LOG = "supervisor.log"

UP_DEADLINE_S = 420.0
"""Deadline for the whole stack to come up (control plane ~10 s, operator
~20 s; generous for a cold, loaded two-core machine)."""

DOWN_DEADLINE_S = 90.0
"""Deadline for the supervisor to stop the stack after SIGTERM."""

POLL_S = 0.3
WATCH_S = 1.0
"""Seconds between the supervisor's passes: it reaps and restarts what died (after its
backoff, localkube.restarts), takes restart requests and rewrites the state file."""

REQUESTS = "requests"
"""Directory of ``restart-NAME`` files that ``cluster restart NAME`` leaves for the supervisor."""

RESTART_DEADLINE_S = 150.0
"""Deadline of ``cluster restart``: the next pass (1 s) plus a start (the operator's ~20 s,
90 s at most)."""

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

PROMETHEUS_PORT = 9090
"""Prometheus's usual port, taken when free (examples/local-sim.yaml names it)."""


class ClusterCommandError(RuntimeError):
    """A `cluster` subcommand failed; printed as one line (exit status 2)."""


# -- the state file -----------------------------------------------------------------------


def state_path(workdir: Path) -> Path:
    return workdir / STATE


def read_state(workdir: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(state_path(workdir).read_text())
    except (OSError, ValueError):
        return None
    return data


def write_state(workdir: Path, state: dict[str, Any]) -> None:
    tmp = state_path(workdir).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1) + "\n")
    tmp.replace(state_path(workdir))


def request_restart(workdir: Path, name: str) -> None:
    """Leave a request for the supervisor to restart ``name`` at its next pass."""
    directory = workdir / REQUESTS
    directory.mkdir(exist_ok=True)
    (directory / f"restart-{name}").touch()


def take_requests(workdir: Path) -> list[str]:
    """The names asked to be restarted since the last pass; the requests are removed."""
    names = []
    for path in sorted((workdir / REQUESTS).glob("restart-*")):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            names.append(path.name.removeprefix("restart-"))
    return names


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped) counts as gone.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# -- the supervisor -------------------------------------------------------------------------


class _Stop(Exception):
    """Raised from a signal handler to unwind start-up or the watch loop."""


def supervise(workdir: Path, options: stack_mod.StackOptions) -> int:
    """Run the stack until a stop signal; always clean up and remove the state file."""
    from slipstream.localkube import stack as stack_mod

    workdir.mkdir(parents=True, exist_ok=True)
    stopping = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:  # already cleaning up: a second Ctrl-C must not cut that short
            return
        stopping = True
        raise _Stop(signal.Signals(signum).name)

    for sig in STOP_SIGNALS:
        signal.signal(sig, on_signal)
    base = {"supervisor_pid": os.getpid(), "workdir": str(workdir)}
    write_state(workdir, {**base, "phase": "Starting"})
    stack: stack_mod.Stack | None = None
    code = 0
    try:
        stack = stack_mod.Stack.start(workdir / "cluster", options)
        keeper = restarts.Keeper(stack.parts())
        state = {**base, "phase": "Ready", **stack.describe()}
        log.info("supervisor: stack ready; pids %s", stack.pids())
        while True:
            for name in take_requests(workdir):
                if name in keeper.parts:
                    log.info("supervisor: restarting %s as asked", name)
                    keeper.restart_now(name)
            keeper.check()
            write_state(workdir, {**state, "pids": stack.pids(), "components": keeper.report()})
            time.sleep(WATCH_S)
    except _Stop as exc:
        log.info("supervisor: %s, stopping the stack", exc)
    except Exception as exc:
        log.exception("supervisor: failed")
        write_state(workdir, {**base, "phase": "Failed", "error": str(exc)})
        code = 1
    finally:
        stopping = True
        if stack is not None:
            try:
                stack.stop()
            except Exception:
                log.exception("supervisor: stopping the stack")
                code = 1
        if code == 0 or stack is not None:
            with contextlib.suppress(FileNotFoundError):
                state_path(workdir).unlink()
    return code


# -- the commands -------------------------------------------------------------------------


def options_from(args: argparse.Namespace) -> stack_mod.StackOptions:
    from slipstream.localkube import stack as stack_mod

    env = {}
    for item in args.operator_env or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ClusterCommandError(f"--operator-env {item!r}: write KEY=VALUE")
        env[key] = value
    if args.time_scale <= 0:
        raise ClusterCommandError("--time-scale must be > 0 (twin seconds per wall second)")
    port = PROMETHEUS_PORT if _port_free(PROMETHEUS_PORT) else None
    return stack_mod.StackOptions(time_scale=args.time_scale, operator_env=env, prometheus_port=port)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _supervisor_argv(workdir: Path, args: argparse.Namespace) -> list[str]:
    argv = [sys.executable, "-m", "slipstream.localkube.supervisor", f"--workdir={workdir}",
            f"--time-scale={args.time_scale}"]  # fmt: skip
    argv += [f"--operator-env={item}" for item in args.operator_env or []]
    return argv


def cmd_up(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir).expanduser().resolve()
    options = options_from(args)
    state = read_state(workdir)
    pid = int(state.get("supervisor_pid", 0)) if state is not None else 0
    if state is not None and pid > 1 and alive(pid):
        if state.get("phase") == "Ready":
            print(f"already up (supervisor pid {state['supervisor_pid']})", file=sys.stderr)
            _print_ready(state, workdir)
            return 0
        raise ClusterCommandError(
            f"a cluster in {workdir} is {state.get('phase')}; wait, or `slipstream cluster down`"
        )
    if state is not None:
        _kill_recorded(state)  # a supervisor that died without cleaning up
        state_path(workdir).unlink(missing_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    if args.foreground:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
        print(f"starting in the foreground (Ctrl-C stops everything); workdir {workdir}",
              file=sys.stderr)  # fmt: skip
        return supervise(workdir, options)
    log_path = workdir / SUPERVISOR_LOG
    with log_path.open("ab") as out:
        proc = subprocess.Popen(
            _supervisor_argv(workdir, args), stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    print(f"starting (supervisor pid {proc.pid}, log {log_path}) ...", file=sys.stderr)

    def abandon(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, abandon)
    try:
        deadline = time.monotonic() + UP_DEADLINE_S
        while True:
            state = read_state(workdir)
            if state is not None and state.get("supervisor_pid") == proc.pid:
                if state.get("phase") == "Ready":
                    _print_ready(state, workdir)
                    return 0
                if state.get("phase") == "Failed":
                    proc.wait(timeout=DOWN_DEADLINE_S)
                    raise ClusterCommandError(f"start-up failed: {state.get('error')}; log: {log_path}")
            if proc.poll() is not None:
                raise ClusterCommandError(
                    f"the supervisor exited with code {proc.returncode}; log: {log_path}\n"
                    + _tail(log_path)
                )
            if time.monotonic() > deadline:
                raise ClusterCommandError(f"not ready within {UP_DEADLINE_S:.0f}s; log: {log_path}")
            time.sleep(POLL_S)
    except (KeyboardInterrupt, ClusterCommandError):
        # Interrupted, timed out or failed: leave nothing behind.
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=DOWN_DEADLINE_S)
        state = read_state(workdir)
        if state is not None:
            _kill_recorded(state)
            state_path(workdir).unlink(missing_ok=True)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def cmd_down(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir).expanduser().resolve()
    state = read_state(workdir)
    if state is None:
        print(f"no cluster in {workdir}", file=sys.stderr)
        return 0
    pid = int(state.get("supervisor_pid", 0))
    if pid > 1 and alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + DOWN_DEADLINE_S
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(POLL_S)
    left = _kill_recorded(state)
    state_path(workdir).unlink(missing_ok=True)
    note = f" (killed {len(left)} leftover process group(s): {', '.join(left)})" if left else ""
    print(f"stopped the cluster in {workdir}{note}", file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """One line per component, from the supervisor's last pass and checked now; exit 0 only
    when every one runs and the operator serves (1: one is down, the stack is still
    starting, or the operator runs paused by kopf's peering; 3: no cluster)."""
    workdir = Path(args.workdir).expanduser().resolve()
    state = read_state(workdir)
    pid = int(state.get("supervisor_pid", 0)) if state else 0
    if state is None or not (pid > 1 and alive(pid)):
        print(f"down (no running cluster in {workdir})")
        return 3
    rows = component_rows(state)
    down = [row for row in rows if row["state"] != "running"]
    phase = str(state.get("phase", "?"))
    serving = operator_serving(state) if phase == "Ready" and not down else None
    if phase != "Ready":
        headline = phase.lower()
    elif down:
        headline = f"degraded: {len(down)} of {len(rows)} component(s) down ({', '.join(r['name'] for r in down)})"
    elif serving is not None:
        headline = serving
    else:
        headline = "ready"
    print(f"{headline} (supervisor pid {pid}, workdir {workdir})")
    for key in ("kubeconfig", "server", "prometheus_url", "pod_cidr", "time_scale", "logs"):
        if state.get(key) is not None:
            print(f"  {key:15s} {state[key]}")
    for row in rows:
        print("  " + component_line(row))
    sims = _simulators(workdir)
    if sims:
        print("  engine simulators:")
        for sim in sims:
            ready = "ready" if sim["ready"] else "starting"
            print(f"    {sim['pod']:40s} {sim['url']:26s} {ready:8s} restarts {sim['restarts']}")
    return 0 if phase == "Ready" and not down and serving is None else 1


def operator_serving(state: dict[str, Any]) -> str | None:
    """None when the operator's /readyz says it serves; else the headline that says why not.
    A running operator process is not a serving one: restarted after a SIGKILL, kopf's
    peering keeps it paused until the killed process's entry expires (the peering
    lifetime), and it handles nothing meanwhile."""
    url = state.get("operator_ready_url")
    if not url:
        return None  # a stack without an operator, or one started before /readyz
    try:
        with urllib.request.urlopen(str(url), timeout=2) as response:
            report = json.loads(response.read())
    except urllib.error.HTTPError as error:
        try:
            report = json.loads(error.read())
        except ValueError:
            return f"operator not serving: /readyz answered {error.code}"
    except (OSError, ValueError) as error:
        return f"operator not serving: /readyz unreachable ({error})"
    if report.get("state") == "serving":
        return None
    if report.get("state") == "paused":
        return (f"operator paused: it runs but kopf's peering holds it ({report.get('why') or 'no reason given'}); "
                "it serves once that peer's entry expires")  # fmt: skip
    return f"operator {report.get('state', 'not serving')}: {report.get('why') or 'kopf has not started yet'}"


def component_rows(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The supervisor's record of each component, its state checked against the process now
    (the record is up to a pass old): a recorded pid that is gone or a zombie is down."""
    rows = []
    for row in state.get("components", []):
        pid = row.get("pid")
        gone = pid is not None and not alive(int(pid))
        rows.append({**row, "state": "down" if gone else row.get("state", "down")})
    return rows


def component_line(row: dict[str, Any]) -> str:
    """``running  12345  operator  restarts 1``, or ``DOWN ... restart in 4 s``, one component."""
    pid = row.get("pid")
    word = "running" if row["state"] == "running" else "DOWN"
    line = f"{word:8s} {pid if pid is not None else '-':>7}  {row['name']:24s} restarts {row.get('restarts', 0)}"
    if row["state"] != "running" and row.get("restart_in_s") is not None:
        line += f", restart in {row['restart_in_s']:.0f} s"
    if row.get("last_error"):
        line += f"; last restart failed: {row['last_error']}"
    return line


def cmd_restart(args: argparse.Namespace) -> int:
    """Ask the supervisor to restart one component now and wait until it runs again."""
    workdir = Path(args.workdir).expanduser().resolve()
    state = read_state(workdir)
    pid = int(state.get("supervisor_pid", 0)) if state else 0
    if state is None or not (pid > 1 and alive(pid)) or state.get("phase") != "Ready":
        raise ClusterCommandError(f"no ready cluster in {workdir}: `slipstream cluster up` first")
    before = {row["name"]: row for row in state.get("components", [])}
    name = args.component
    if name not in before:
        raise ClusterCommandError(f"no component {name!r}; COMPONENT is one of: {', '.join(sorted(before))}")
    request_restart(workdir, name)
    deadline = time.monotonic() + RESTART_DEADLINE_S
    while time.monotonic() < deadline:
        time.sleep(POLL_S)
        now = {row["name"]: row for row in component_rows(read_state(workdir) or {})}
        row = now.get(name)
        if row is not None and row.get("restarts", 0) > before[name].get("restarts", 0) and row["state"] == "running":
            print(f"restarted {name} (pid {before[name].get('pid')} -> {row.get('pid')})", file=sys.stderr)
            return 0
        if row is not None and row.get("last_error") and row.get("last_error") != before[name].get("last_error"):
            raise ClusterCommandError(f"restarting {name} failed: {row['last_error']}; log: {workdir / SUPERVISOR_LOG}")
    raise ClusterCommandError(f"{name} did not run again within {RESTART_DEADLINE_S:.0f}s; log: {workdir / SUPERVISOR_LOG}")


def _simulators(workdir: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads((workdir / "cluster" / "podrunner.json").read_text())
    except (OSError, ValueError):
        return []
    return list(data.get("simulators", []))


def _print_ready(state: dict[str, Any], workdir: Path) -> None:
    url = state.get("prometheus_url")
    print(f"cluster up: apiserver {state['server']}, Prometheus {url},"
          f" pod CIDR {state.get('pod_cidr')}", file=sys.stderr)  # fmt: skip
    if url and not str(url).endswith(f":{PROMETHEUS_PORT}"):
        # examples/local-sim.yaml names :9090; on a shared machine that may be another
        # cluster's Prometheus, whose series would then steer this one's tuner.
        print(f"note: port {PROMETHEUS_PORT} was taken: set spec.prometheus.url to {url} "
              f"(examples/local-sim.yaml names http://127.0.0.1:{PROMETHEUS_PORT})", file=sys.stderr)  # fmt: skip
    same = "" if workdir == DEFAULT_WORKDIR.expanduser().resolve() else f" --workdir {workdir}"
    print(f"stop it with: slipstream cluster down{same}", file=sys.stderr)
    print(f"export KUBECONFIG={state['kubeconfig']}")
    if state.get("bin_dir"):
        print(f"export PATH={state['bin_dir']}:$PATH  # kubectl and helm")


def _kill_recorded(state: dict[str, Any]) -> list[str]:
    """SIGKILL every recorded process group still alive; return their names."""
    left = []
    for name, pid in state.get("pids", {}).items():
        if int(pid) > 1 and processes.group_alive(int(pid)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            left.append(name)
    return left


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def add_parser(sub: Any) -> None:
    """The ``cluster`` subcommand and its ``up``, ``down``, ``status`` and ``restart``."""
    cluster = sub.add_parser("cluster", help="a local control plane with Prometheus, the operator "
                             "and simulated engines: up | down | status | restart")  # fmt: skip
    verbs = cluster.add_subparsers(dest="verb", required=True)
    for name, func, text in (
        ("up", cmd_up, "start it in the background; prints the `export KUBECONFIG=...` line"),
        ("down", cmd_down, "stop everything it started"),
        ("status", cmd_status, "one line per component, with process ids and engine simulators; "
                               "exit status 1 when one is down or the operator is paused"),
        ("restart", cmd_restart, "restart one component now (operator, prometheus, kube-apiserver, ...)"),
    ):
        verb = verbs.add_parser(name, help=text)
        verb.add_argument("--workdir", default=str(DEFAULT_WORKDIR),
                          help="state, logs, kubeconfig (default: %(default)s)")  # fmt: skip
        verb.set_defaults(func=func)
        if name == "restart":
            verb.add_argument("component", metavar="COMPONENT",
                              help="a name `slipstream cluster status` lists, e.g. operator")  # fmt: skip
        if name == "up":
            add_up_options(verb)
            verb.add_argument("--foreground", action="store_true",
                              help="run in this terminal until Ctrl-C instead of in the background")  # fmt: skip


def add_up_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--time-scale", type=float, default=1.0, metavar="S",
                        help="twin seconds per wall second in the engine simulators (default 1)")  # fmt: skip
    parser.add_argument("--operator-env", action="append", metavar="KEY=VALUE",
                        help="extra environment of the operator, e.g. SLIPSTREAM_ROLLOUT_POLL_SECONDS=2 "
                             "(the settings: operator/slipstream/controller/settings.py)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """The supervisor process (started by ``cluster up``)."""
    parser = argparse.ArgumentParser(prog="python -m slipstream.localkube.supervisor")
    parser.add_argument("--workdir", required=True)
    add_up_options(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    return supervise(Path(args.workdir), options_from(args))


if __name__ == "__main__":
    raise SystemExit(main())
