"""The docs' commands still run: every `slipstream CMD --flag` that README.md and docs/*.md
show is a flag of that command, and every operator setting a help text names is a real one.

A new user copies these lines; a renamed or dropped flag must fail here, not in their shell.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import fields
from pathlib import Path

from slipstream import cli
from slipstream.controller.settings import ControllerSettings

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(
    r"slipstream (cluster (?:up|down|status)|simulate|bench|recommend|run|engine-sim|load|demo)\b([^`\n]*)"
)
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _parser_for(command: str) -> argparse.ArgumentParser:
    parser = cli.build_parser()
    for word in command.split():
        parser = _subparsers(parser)[word]
    return parser


def _doc_commands() -> list[tuple[str, str, str]]:
    """(doc, command, flag) for every flag written after `slipstream COMMAND` in the docs."""
    found = []
    for doc in DOCS:
        text = doc.read_text().replace("\\\n", " ")  # shell line continuations
        for match in COMMAND.finditer(text):
            for flag in FLAG.findall(match.group(2)):
                found.append((doc.name, match.group(1), flag))
    return found


def test_every_flag_the_docs_show_is_accepted_by_its_command():
    commands = _doc_commands()
    assert len(commands) > 50, "the docs' slipstream commands were not found: check COMMAND"
    unknown = [
        f"{doc}: slipstream {command} {flag}"
        for doc, command, flag in commands
        if flag not in _parser_for(command)._option_string_actions
    ]
    assert not unknown, "flags the docs show but the command does not take:\n" + "\n".join(unknown)


def test_the_operator_settings_named_in_help_texts_exist():
    known = {f"SLIPSTREAM_{f.name.upper()}" for f in fields(ControllerSettings)}
    helps = _parser_for("cluster up").format_help() + _parser_for("run").format_help()
    named = set(re.findall(r"SLIPSTREAM_[A-Z_]+", helps))
    assert named, "cluster up --help no longer gives an example setting"
    assert named <= known, f"not operator settings: {sorted(named - known)}"


def test_cluster_up_says_how_to_stop_it_and_when_prometheus_is_not_on_9090(capsys, tmp_path):
    from slipstream.localkube import supervisor

    state = {"server": "https://127.0.0.1:1", "prometheus_url": "http://127.0.0.1:46687",
             "pod_cidr": "127.2.0.0/16", "kubeconfig": str(tmp_path / "admin.kubeconfig")}  # fmt: skip
    supervisor._print_ready(state, tmp_path)
    err = capsys.readouterr().err
    assert "set spec.prometheus.url to http://127.0.0.1:46687" in err
    assert f"slipstream cluster down --workdir {tmp_path}" in err
    supervisor._print_ready({**state, "prometheus_url": "http://127.0.0.1:9090"},
                            supervisor.DEFAULT_WORKDIR.expanduser().resolve())  # fmt: skip
    err = capsys.readouterr().err
    assert "spec.prometheus.url" not in err
    assert err.rstrip().endswith("stop it with: slipstream cluster down")
