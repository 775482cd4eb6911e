"""Every command's usage: `--help` reads whole at 80 and 120 columns (no word, option name, choice, path or help
text, is cut or broken across lines; flags carry no ``<bool>``), and an unknown option is one line."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from wavefront.cli import build_app

_BOX = re.compile(r"[│╭╮╰╯─]")


def _commands() -> list[tuple[str, ...]]:
    import typer

    out: list[tuple[str, ...]] = []

    def walk(cmd, path: tuple[str, ...]) -> None:
        out.append(path)
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, (*path, name))

    walk(typer.main.get_command(build_app()), ())
    return out


COMMANDS = _commands()


def _help(path: tuple[str, ...], columns: int) -> str:
    r = CliRunner().invoke(build_app(), [*path, "--help"], env={"COLUMNS": str(columns)})
    assert r.exit_code == 0, r.output
    return r.output


def _words(text: str) -> set[str]:
    return set(_BOX.sub(" ", text).split())


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "wavefront")
def test_help_keeps_every_word_whole(path):
    """Every word printed at 80 or 120 columns is a word of the same help printed without a width limit: a word
    cut with an ellipsis or folded across lines is not."""
    whole = _words(_help(path, 2000))
    for columns in (80, 120):
        text = _help(path, columns)
        assert max(map(len, text.splitlines())) <= columns
        assert _words(text) <= whole, (columns, sorted(_words(text) - whole))
        assert "<bool>" not in text


def test_help_shows_choices_and_defaults():
    text = " ".join(_BOX.sub(" ", _help(("compare",), 80)).split())
    assert "fwd | bwd | fwd_bwd" in text and "[default: 6; x>=1]" in text
    assert "--no-traffic" in _help(("bench",), 80)


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "wavefront")
def test_unknown_option_is_one_line_on_every_command(path):
    r = CliRunner().invoke(build_app(), [*path, "--no-such-option"])
    assert r.exit_code == 2 and "Usage:" not in r.output and "╭" not in r.output, r.output
    (line,) = r.stderr.strip().splitlines()
    assert "No such option: --no-such-option" in line and f"{' '.join(('wavefront', *path))} --help" in line
