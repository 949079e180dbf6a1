"""``slipstream --help`` and every subcommand's help: no text stops mid-sentence (issue 18:
the description used to be the docstring's first line, cut at "``recommend`` (the")."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

import pytest

from slipstream import cli

DANGLING = {"the", "a", "an", "of", "and", "or", "to", "for", "with", "in", "on", "by", "from",
            "is", "as", "at", "than", "that", "its", "their"}


def texts(parser: argparse.ArgumentParser, path: str = "slipstream") -> Iterator[tuple[str, str]]:
    """(where, text) of a parser's description, its arguments' and subcommands' help."""
    if parser.description:
        yield f"{path}: description", parser.description
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                yield f"{path} {choice.dest}: help", choice.help or ""
            for name, sub in action.choices.items():
                yield from texts(sub, f"{path} {name}")
        elif action.help and action.help is not argparse.SUPPRESS:
            yield f"{path} {'/'.join(action.option_strings) or action.dest}: help", action.help


ALL = list(texts(cli.build_parser()))


def test_every_subcommand_is_reached():
    where = {w.split(":")[0] for w, _ in ALL}
    assert {"slipstream simulate", "slipstream bench", "slipstream recommend", "slipstream run",
            "slipstream engine-sim", "slipstream load", "slipstream cluster",
            "slipstream demo"} <= where


@pytest.mark.parametrize("where, text", ALL, ids=[w for w, _ in ALL])
def test_no_help_text_stops_mid_sentence(where, text):
    words = text.strip()
    assert words, f"{where}: empty"
    assert not words.endswith(("(", ",", ":", ";", "-", "/", "``")), f"{where}: {text!r}"
    last = re.findall(r"[A-Za-z]+", words.split()[-1])
    assert not last or last[-1].lower() not in DANGLING, f"{where}: ends on {last[-1]!r}: {text!r}"
    assert words.count("(") == words.count(")"), f"{where}: unbalanced parentheses: {text!r}"
    assert words.count("`") % 2 == 0, f"{where}: unbalanced backquotes: {text!r}"


def test_the_description_is_the_docstrings_whole_first_paragraph():
    text = cli.build_parser().description or ""
    assert text.startswith("The slipstream command:") and text.endswith(".")
    for name in ("simulate", "bench", "recommend", "run", "engine-sim", "load", "cluster", "demo"):
        assert name in text
    assert "``" not in text
