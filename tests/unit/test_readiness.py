"""`/readyz`: serving only when kopf's startup ran and its peering does not pause it."""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import urllib.error
import urllib.request

import pytest

from slipstream.controller.runtime import readiness


def test_a_peered_process_is_paused_until_kopf_resumes_it() -> None:
    serving = readiness.Serving(peering=True)
    assert serving.state() == "starting"
    serving.mark_started()
    assert serving.state() == "paused", "kopf starts a peered operator paused until its first peering decision"
    serving.note("Resuming operations after the pause. Conflicting operators with the same priority are gone.")
    assert serving.state() == "serving"
    serving.note("Pausing operations in favour of [<Peer x@y: priority=9, lifetime=60, lastseen=...>].")
    assert serving.state() == "paused" and "in favour of" in str(serving.report()["why"])
    serving.note("Keep-alive in 'slipstream' cluster-wide: ok.")  # other peering lines change nothing
    assert serving.state() == "paused"


def test_a_standalone_process_serves_once_started() -> None:
    serving = readiness.Serving(peering=False)
    assert serving.state() == "starting"
    serving.mark_started()
    assert serving.state() == "serving"


def test_readyz_is_200_only_when_serving_and_standby_ok_also_accepts_a_pause() -> None:
    serving = readiness.Serving(peering=True)
    assert readiness.answer(serving, "")[0] == 503
    assert readiness.answer(serving, "standby=ok")[0] == 503, "starting is never ready"
    serving.mark_started()
    code, body = readiness.answer(serving, "")
    assert code == 503 and json.loads(body)["state"] == "paused"
    assert readiness.answer(serving, "standby=ok")[0] == 200
    serving.note(readiness.RESUMING + " after the pause.")
    assert readiness.answer(serving, "")[0] == 200


def test_the_peering_logger_feeds_the_state_and_the_endpoint_answers_over_http() -> None:
    serving = readiness.Serving(peering=True)
    handler = readiness.watch_peering(serving)
    server = readiness.serve(serving, "127.0.0.1", 0)
    try:
        serving.mark_started()
        url = f"http://127.0.0.1:{server.server_address[1]}/readyz"
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=5)
        assert refused.value.code == 503
        logging.getLogger(readiness.PEERING_LOGGER).info("Resuming operations after the pause. Gone.")
        with urllib.request.urlopen(url, timeout=5) as response:
            assert response.status == 200 and json.loads(response.read())["state"] == "serving"
    finally:
        server.shutdown()
        logging.getLogger(readiness.PEERING_LOGGER).removeHandler(handler)


def test_kopf_still_logs_the_messages_the_state_is_read_from() -> None:
    """The pause is read from kopf's log: the pinned kopf must still write these lines, from
    the logger watched."""
    module = importlib.import_module(readiness.PEERING_LOGGER)
    source = inspect.getsource(module)
    assert "logger = logging.getLogger(__name__)" in source
    assert f'logger.info(f"{readiness.PAUSING} in favour of' in source
    assert f'logger.info(f"{readiness.RESUMING} after the pause.' in source
    assert f'logger.warning(f"{readiness.PAUSING_ALL}, including self' in source


def test_cluster_status_says_paused_while_the_operator_runs_but_does_not_serve() -> None:
    from slipstream.localkube import supervisor

    serving = readiness.Serving(peering=True)
    server = readiness.serve(serving, "127.0.0.1", 0)
    state = {"operator_ready_url": f"http://127.0.0.1:{server.server_address[1]}/readyz"}
    try:
        assert supervisor.operator_serving(state) == "operator starting: waiting for kopf's first peering decision"
        serving.mark_started()
        serving.note("Pausing operations in favour of [<Peer old: priority=7>].")
        said = supervisor.operator_serving(state)
        assert said is not None and said.startswith("operator paused") and "<Peer old" in said, said
        serving.note("Resuming operations after the pause.")
        assert supervisor.operator_serving(state) is None
    finally:
        server.shutdown()
    said = supervisor.operator_serving(state)  # nothing listens any more
    assert said is not None and "unreachable" in said, said
    assert supervisor.operator_serving({}) is None, "a stack without an operator has nothing to ask"


def test_cluster_up_keeps_the_operators_listeners_on_loopback_and_a_pod_on_every_address() -> None:
    """docs/localkube.md: only loopback is used by `cluster up`; in a pod the metrics and
    /readyz must answer on the pod IP."""
    from pathlib import Path

    from slipstream.controller import settings
    from slipstream.localkube import stack

    class Options:  # what operator_env reads of a Stack, without starting one
        time_scale = 1.0
        operator_env: dict[str, str] = {}

    class Cluster:
        pod_cidr = "127.9.0.0/16"

    class Fake:
        options, cluster = Options(), Cluster()

    env = stack.Stack.operator_env(Fake())  # type: ignore[arg-type]
    assert env["SLIPSTREAM_LISTEN_ADDRESS"] == "127.0.0.1"
    assert settings.ControllerSettings().listen_address == "0.0.0.0"
    doc = (Path(__file__).resolve().parents[2] / "docs" / "localkube.md").read_text()
    assert "listeners bind 127.0.0.1 here (`SLIPSTREAM_LISTEN_ADDRESS`" in doc
