"""The operator image matches what the chart runs (docker cannot build here: checked by reading)."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_image_runs_the_operator_as_the_charts_user_without_dev_or_engine_packages():
    text = (REPO / "Dockerfile").read_text()
    deployment = (REPO / "charts/slipstream/templates/deployment.yaml").read_text()
    assert 'ENTRYPOINT ["python", "-m", "slipstream.controller"]' in text
    assert 'command: ["python", "-m", "slipstream.controller"]' in deployment
    assert "USER 65532:65532" in text and "runAsUser: 65532" in deployment
    install = [line for line in text.splitlines() if "pip install" in line]
    assert install and all("[dev]" not in line and "torch" not in line for line in install)


def test_build_command_in_the_dockerfile_names_the_charts_image():
    values = yaml.safe_load((REPO / "charts/slipstream/values.yaml").read_text())
    chart = yaml.safe_load((REPO / "charts/slipstream/Chart.yaml").read_text())
    ref = f"{values['image']['repository']}:{chart['appVersion']}"
    assert f"docker build -t {ref} ." in (REPO / "Dockerfile").read_text()
