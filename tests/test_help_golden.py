"""Every command's `--help`, kept under tests/golden/help/: a refactor that changes what an owner
reads there shows up as a diff (the top-level listing is its own file, `sparkstack.txt`)."""

import click
import pytest
from click.testing import CliRunner

from conftest import ROOT
from launcher.cli.commands import main

GOLDEN = ROOT / "tests" / "golden" / "help"


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command below `group`, as the words that name it (`("sandbox", "up")`)."""
    ctx = click.Context(group)
    paths = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        paths.append((*prefix, name))
        if isinstance(command, click.Group):
            paths += command_paths(command, (*prefix, name))
    return paths


def help_text(words: tuple[str, ...]) -> str:
    result = CliRunner().invoke(main, [*words, "--help"], prog_name="sparkstack", terminal_width=100)
    assert result.exit_code == 0, result.output
    return result.output


def test_the_walk_sees_every_command():
    names = {p[0] for p in command_paths(main)}
    assert {"init", "check", "up", "plan", "sandbox", "stage"} <= names
    assert ("sandbox", "up") in command_paths(main)


@pytest.mark.parametrize("words", command_paths(main), ids=" ".join)
def test_command_help_matches_golden(words, golden):
    golden.check(GOLDEN / f"{'-'.join(words)}.txt", help_text(words))


def test_top_level_help_matches_golden(golden):
    golden.check(GOLDEN / "sparkstack.txt", help_text(()))
