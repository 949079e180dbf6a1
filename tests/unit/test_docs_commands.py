"""The docs still say what is: every `slipstream CMD --flag` that README.md and docs/*.md
show is a flag of that command, every operator setting a help text names is a real one,
every measured figure carries its command and date, every link and every test they name
exists.

A new user copies these lines; a renamed or dropped flag must fail here, not in their shell.
A figure nobody can reproduce, or a test that was renamed, must fail here, not mislead.
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
    r"slipstream (cluster (?:up|down|status|restart)|simulate|bench|recommend|run|engine-sim|load|demo|loopbench"
    r"|canary-check)(?![\w-])([^`\n]*)"
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
    checked = {command for _, command, _ in commands}
    # The commands whose flags the docs show most: each must be among those checked.
    assert {"loopbench", "canary-check", "cluster up", "demo"} <= checked, sorted(checked)
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


# --- Figures carry their command and date -------------------------------------------------
#
# The rule, kept simple on purpose (docs/testing.md, "Writing docs", says the same):
#
# 1. A figure is a number with a unit: s, ms, min, h, %, kB, KiB, MB, MiB, GB, GiB, TiB,
#    tok/s, tokens/s, req/s, requests/s, or a ratio written 1.05x. A range counts once
#    ("0.8-6.9 s"). Inline code (`--interval 60`), code blocks, headings and GPU shapes
#    ("8x H200", "4xA100") are not looked at.
# 2. A figure stated as design is left alone: one with a word of DESIGN_WORDS in the
#    DESIGN_BEFORE characters before it ("default 60 s", "at most 4", "every 30 s",
#    "<= 3.5 s"; an arrow "->" is not ">"), or a noun of DESIGN_NOUNS right before or right
#    after it ("interval 60 s", "a 30 s timeout"); a row of a table whose header's first
#    cell is one of DESIGN_TABLES (flags, fields, settings, options, metrics); and every
#    figure of a section that opens with INPUTS (sourced inputs, e.g. a profile's hardware).
# 3. Any other figure is a measurement: within WINDOW lines of it, in the same section
#    (between two headings), there must be a command (a fenced code block not marked
#    `text`, or inline code starting with one of COMMAND_STARTS) and a date (YYYY-MM-DD).

WINDOW = 15
DESIGN_BEFORE = 24
DESIGN_AFTER = 16
INPUTS = "<!-- inputs, not measurements -->"
UNITS = r"(?:x|\s?(?:ms|s|min|h|%|kB|KiB|MB|MiB|GB|GiB|TiB|tok/s|tokens/s|req/s|requests/s))"
FIGURE = re.compile(
    r"(?<![\w.\-/$#])~?\d[\d,]*(?:\.\d+)?(?:\s?[-–]\s?~?\d[\d,]*(?:\.\d+)?)?" + UNITS
    + r"(?![\w/])(?!\s?[A-Z]\d)"
)
DESIGN_WORDS = re.compile(
    r"\b(?:defaults?|at most|at least|up to|no more than|limits?|timeouts?|deadline|bound|"
    r"target|goal|every|within|doubling|over|below|under|beyond|settable|"
    r"set to)\b|<=|>=|≤|≥|<(?!-)|(?<!-)>",
    re.IGNORECASE,
)
DESIGN_NOUNS = r"(?:target|interval|cooldown|window|analysis|lifetime|budget|backoff|buckets?|timeout|deadline|limit)"
DESIGN_NOUN_BEFORE = re.compile(r"\b" + DESIGN_NOUNS + r"(?: of)?\W{0,2}$", re.IGNORECASE)
DESIGN_NOUN_AFTER = re.compile(r"^\W{0,2}" + DESIGN_NOUNS + r"\b", re.IGNORECASE)
DESIGN_TABLES = re.compile(r"^\| *`?(?:flag|field|setting|option|metric|default)s?\b", re.IGNORECASE)
COMMAND_STARTS = (
    "slipstream ", "make ", "python", ".venv/bin/", "bash ", "scripts/", "pytest", "time ",
    "flock ", "timeout ", "nice ", "PYTHONPATH=", "SLIPSTREAM_", "SGLANG_", "MALLOC_",
    "tests/", "kubectl ", "helm ", "curl ", "docker ", "git ",
)
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
INLINE = re.compile(r"`[^`\n]*`")
LINK_TARGET = re.compile(r"\]\([^)]*\)")


def _doc_lines(doc: Path) -> list[tuple[int, str, str]]:
    """(line number, kind, text): kind is 'fence' (a line of a fenced block not marked
    text), 'code' (a fence line, or inside a text block), 'heading', 'design' (a row of a
    design table, or a line of an INPUTS section) or 'prose'."""
    lines: list[tuple[int, str, str]] = []
    fence, table_is_design, inputs = None, False, False
    for number, text in enumerate(doc.read_text().splitlines(), 1):
        if text.lstrip().startswith("```"):
            fence = None if fence is not None else text.strip()[3:].strip()
            kind = "code"
        elif fence is not None:
            kind = "code" if fence == "text" else "fence"
        elif text.startswith("#"):
            kind, inputs = "heading", False
        elif text.strip() == INPUTS and lines and lines[-1][1] in ("heading", "blank"):
            kind, inputs = "design", True
        elif inputs:
            kind = "design"
        elif text.startswith("|"):
            if not lines or not lines[-1][2].startswith("|"):
                table_is_design = bool(DESIGN_TABLES.match(text))
            kind = "design" if table_is_design else "prose"
        else:
            kind = "prose" if text.strip() else "blank"
        lines.append((number, kind, text))
    return lines


def _has_command(kind: str, text: str) -> bool:
    if kind == "fence":
        return True
    spans = [span.strip("`") for span in INLINE.findall(text)]
    if text.count("`") % 2:  # inline code that goes on to the next line
        spans.append(text.rsplit("`", 1)[1])
    return kind in ("prose", "design") and any(span.lstrip().startswith(COMMAND_STARTS) for span in spans)


def _measurements(text: str) -> list[str]:
    """The figures of one prose line that are not stated as design (rules 1 and 2)."""
    plain = LINK_TARGET.sub("]", INLINE.sub(lambda m: " " * len(m.group()), text))
    found = []
    for match in FIGURE.finditer(plain):
        before = plain[max(0, match.start() - DESIGN_BEFORE):match.start()]
        after = plain[match.end():match.end() + DESIGN_AFTER]
        if not (DESIGN_WORDS.search(before) or DESIGN_NOUN_BEFORE.search(before)
                or DESIGN_NOUN_AFTER.search(after)):  # fmt: skip
            found.append(match.group().strip())
    return found


def _undated_figures(doc: Path, root: Path = ROOT) -> list[str]:
    lines = _doc_lines(doc)
    section, sections = 0, []
    for _, kind, _ in lines:
        section += kind == "heading"
        sections.append(section)
    commands = [i for i, (_, kind, text) in enumerate(lines) if _has_command(kind, text)]
    dates = [i for i, (_, kind, text) in enumerate(lines) if kind != "heading" and DATE.search(text)]

    def near(marks: list[int], i: int) -> bool:
        return any(abs(j - i) <= WINDOW and sections[j] == sections[i] for j in marks)

    missing = []
    for i, (number, kind, text) in enumerate(lines):
        if kind != "prose":
            continue
        for figure in _measurements(text):
            lacks = [what for what, marks in (("command", commands), ("date", dates))
                     if not near(marks, i)]  # fmt: skip
            if lacks:
                missing.append(f"{doc.relative_to(root)}:{number}: {figure!r} has no "
                               f"{' and no '.join(lacks)} within {WINDOW} lines")  # fmt: skip
    return missing


def test_the_figure_rule_tells_measurements_from_design(tmp_path):
    assert _measurements("took 3.4 s and 1.07x, 62 MB RSS, 12 tok/s") == [
        "3.4 s", "1.07x", "62 MB", "12 tok/s"]  # fmt: skip
    assert _measurements("0.8-6.9 s wall per policy") == ["0.8-6.9 s"]
    assert _measurements("interval (default 60 s), `--window 120`, at most 4x, every 30 s") == []
    assert _measurements("a 5 s interval, cooldown 180 s: 0.57 s per interval; p99 0.8 s -> 0.5 s") == [
        "0.57 s", "0.8 s", "0.5 s"]  # fmt: skip
    assert _measurements("on 8x H200 and 4xA100, seed-000, v1.36.3, p99 of 12") == []
    doc = tmp_path / "doc.md"
    doc.write_text("## Measured\n\nIt took 3.4 s.\n\n| field | default |\n|---|---|\n| a | 60 s |\n\n"
                   "## Inputs\n" + INPUTS + "\n\n8 x 143,771 MiB of HBM.\n\n"
                   "## Dated\n\nIt took 2.0 s (`make bench`, 2026-12-02).\n")  # fmt: skip
    assert _undated_figures(doc, tmp_path) == [
        "doc.md:3: '3.4 s' has no command and no date within 15 lines"]  # fmt: skip


def test_every_figure_in_the_docs_has_its_command_and_date_nearby():
    missing = [line for doc in DOCS for line in _undated_figures(doc)]
    assert not missing, (
        "figures without the command that measures them and the date it was measured "
        "(add both within a few lines, say the figure is a setting, or drop it):\n"
        + "\n".join(missing)
    )


LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    return {_anchor(text) for _, kind, text in _doc_lines(doc) if kind == "heading"}


def test_every_link_in_the_docs_reaches_a_file_and_heading():
    broken = []
    for doc in [*DOCS, ROOT / "CHANGELOG.md"]:
        for number, kind, text in _doc_lines(doc):
            if kind in ("code", "fence"):
                continue
            for target in LINK.findall(text):
                if target.startswith(("http://", "https://", "mailto:")):
                    continue
                path, _, anchor = target.partition("#")
                file = (doc.parent / path).resolve() if path else doc
                if not file.exists():
                    broken.append(f"{doc.name}:{number}: {target} (no such file)")
                elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
                    broken.append(f"{doc.name}:{number}: {target} (no such heading)")
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)


TEST_REF = re.compile(r"`(?:\.\.\.|(tests/[\w/]+\.py|test_\w+\.py))?::(test_\w+)")


def test_every_test_the_docs_name_exists():
    """`tests/x.py::test_y` and a following `::test_z` (same file) in the docs name real tests;
    a bare `test_x.py::` is looked for anywhere under tests/."""
    missing, named = [], 0
    for doc in DOCS:
        for number, _, text in _doc_lines(doc):
            last = None
            for path, name in TEST_REF.findall(text):
                last = path or last
                if last is None:
                    continue
                files = [ROOT / last] if last.startswith("tests/") else list((ROOT / "tests").rglob(last))
                named += 1
                if not any(f.exists() and re.search(rf"def {name}\b", f.read_text()) for f in files):
                    missing.append(f"{doc.name}:{number}: {last}::{name}")
    assert named > 20, "the docs' test references were not found: check TEST_REF"
    assert not missing, "tests the docs name that do not exist:\n" + "\n".join(missing)
