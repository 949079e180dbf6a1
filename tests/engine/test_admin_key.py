"""The admin key reaches the engine through the environment or a file, never argv, and
never leaves it: the start-up log line (`logger.info(f"{server_args=}")`) is redacted.
The info endpoints are checked over HTTP in test_http.py."""

from __future__ import annotations

import logging

import pytest
from sglang.srt.server_args import ServerArgs, prepare_server_args
from sglang.srt.utils.secrets_redaction import ADMIN_KEY_ENV

KEY = "k3y-that-must-not-leak"


def test_key_from_the_environment(monkeypatch):
    monkeypatch.setenv(ADMIN_KEY_ENV, KEY)
    assert prepare_server_args(["--model-path", "dummy"]).admin_api_key == KEY


def test_key_from_a_file_wins_over_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(ADMIN_KEY_ENV, "from-env")
    f = tmp_path / "api-key"
    f.write_text(KEY + "\n")
    args = prepare_server_args(["--model-path", "dummy", "--admin-api-key-file", str(f)])
    assert args.admin_api_key == KEY


@pytest.mark.parametrize("content, reason", [(None, "cannot read"), ("  \n", "is empty")])
def test_a_missing_or_empty_key_file_refuses_to_start(tmp_path, content, reason):
    f = tmp_path / "api-key"
    if content is not None:
        f.write_text(content)
    with pytest.raises(ValueError, match=f"--admin-api-key-file .*{reason}"):
        ServerArgs(model_path="dummy", admin_api_key_file=str(f))


def test_no_key_anywhere_leaves_admin_endpoints_keyless(monkeypatch):
    monkeypatch.delenv(ADMIN_KEY_ENV, raising=False)
    assert ServerArgs(model_path="dummy").admin_api_key is None


def test_the_start_up_log_line_is_redacted(monkeypatch, caplog):
    monkeypatch.setenv(ADMIN_KEY_ENV, KEY)
    args = ServerArgs(model_path="dummy", api_key="user-key-also-secret")
    logger = logging.getLogger("sglang.srt.entrypoints.engine")
    with caplog.at_level(logging.INFO, logger=logger.name):
        logger.info(f"{args=}")  # what Engine._launch_subprocesses logs
    assert KEY not in caplog.text and "user-key-also-secret" not in caplog.text
    assert "admin_api_key='<redacted>'" in caplog.text
    assert "chunked_prefill_size=" in caplog.text


def test_argv_key_still_works_but_warns(monkeypatch, caplog, capfd):
    monkeypatch.delenv(ADMIN_KEY_ENV, raising=False)
    with caplog.at_level(logging.WARNING):
        args = prepare_server_args(["--model-path", "dummy", "--admin-api-key", KEY])
    assert args.admin_api_key == KEY
    # prepare_server_args configures logging to stderr before parsing.
    assert "visible in the process list" in caplog.text + capfd.readouterr().err
