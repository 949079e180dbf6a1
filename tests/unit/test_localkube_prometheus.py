"""The rendered Prometheus config and the pod-discovery rules (pure; the servers are tested
in tests/integration and tests/cluster)."""

from __future__ import annotations

import pytest

from slipstream.localkube import poddiscovery
from slipstream.localkube import prometheus as localprom


def pod(name: str, *, labelled: bool = True, phase: str = "Running", ip: str | None = "127.1.0.5",
        port_name: str = "http") -> dict:
    labels = {poddiscovery.NAME_LABEL: "chat"} if labelled else {}
    status = {"phase": phase, **({"podIP": ip} if ip else {})}
    return {
        "metadata": {"name": name, "namespace": "team-a", "labels": labels},
        "spec": {"containers": [{"name": "engine", "ports": [{"name": port_name, "containerPort": 30000}]}]},
        "status": status,
    }


def test_only_running_labelled_pods_with_the_http_port_are_targets():
    pods = [pod("chat-0"), pod("plain", labelled=False), pod("pending", phase="Pending", ip=None),
            pod("no-ip", ip=None), pod("metrics-port", port_name="metrics")]
    assert poddiscovery.targets(pods) == [{
        "targets": ["127.1.0.5:30000"],
        "labels": {"namespace": "team-a", "pod": "chat-0", "servingdeployment": "chat",
                   "__metrics_path__": "/metrics"},
    }]


def test_config_scrapes_every_second_and_normalizes_sglang_names():
    config = localprom.render_config(
        scrape_interval_s=1.0,
        static=[localprom.StaticTarget("127.0.0.1:9", namespace="ns", pod="p", servingdeployment="sd")],
        discovery_url="http://127.0.0.1:1/targets",
    )
    assert config["global"]["scrape_interval"] == "1000ms"
    assert config["global"]["scrape_timeout"] == "1000ms"
    static, pods = config["scrape_configs"]
    assert static["static_configs"][0]["labels"] == {"namespace": "ns", "pod": "p", "servingdeployment": "sd"}
    assert pods["http_sd_configs"] == [{"url": "http://127.0.0.1:1/targets", "refresh_interval": "1000ms"}]
    assert pods["metric_relabel_configs"] == [localprom.SGLANG_NAME_RELABEL]
    raw = localprom.render_config(scrape_interval_s=30, static=[localprom.StaticTarget("127.0.0.1:9")],
                                  normalize_sglang_names=False)
    assert raw["global"]["scrape_timeout"] == "10000ms"
    assert raw["scrape_configs"][0]["metric_relabel_configs"] == []
    with pytest.raises(ValueError, match="scrape_interval_s must be > 0"):
        localprom.render_config(scrape_interval_s=0)


def test_missing_binary_names_the_install_script(monkeypatch, tmp_path):
    monkeypatch.setenv(localprom.BINARY_ENV, str(tmp_path / "nope"))
    with pytest.raises(localprom.PrometheusMissingError, match="scripts/install-prometheus.sh"):
        localprom.binary()
