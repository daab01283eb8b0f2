"""The command line's own pieces: the table of commands loaded by name (nothing imported before a
command is run or listed; `sparkstack --help` in an owner's order) and check's table, where a
verdict every rank shares is printed once with the ranks named."""

from __future__ import annotations

import json
import subprocess
import sys

import click
from click.testing import CliRunner

from launcher.apply import preflight
from launcher.check import report as check
from launcher.check.rows.case import RankReport
from launcher.status import Finding
from launcher.cli import commands
from launcher.cli.check import ranks_named, shared_verdicts
from launcher.cli.commands import main
from launcher.status import Status
from test_check import sandbox_cluster
from test_layers import ROOT, imports, kit_target

CLI = ROOT / "launcher" / "cli"


# --- the table of commands ------------------------------------------------------------------

def test_version_imports_no_command():
    """`sparkstack --version` imports the group and nothing it names: no command module, no rich,
    no pydantic (the config), no sandbox."""
    code = ("import json, sys\n"
            "sys.argv = ['sparkstack', '--version']\n"
            "from launcher.cli.commands import main\n"
            "try:\n    main()\n"
            "except SystemExit:\n    pass\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    version, loaded = done.stdout.splitlines()
    assert version == "sparkstack, version 0.1.0"
    loaded = json.loads(loaded)
    assert [m for m in loaded if m.startswith("launcher")] == ["launcher", "launcher.cli", "launcher.cli.commands"]
    assert not {"rich", "pydantic", "yaml", "paramiko"} & set(loaded)


def test_every_command_is_named_by_its_module_and_listed_in_a_section():
    ctx = click.Context(main)
    assert main.list_commands(ctx) == list(commands.COMMANDS)
    for name, where in commands.COMMANDS.items():
        module, attribute = where.split(":")
        command = main.get_command(ctx, name)
        assert isinstance(command, click.Command) and command.name == name, where
        if name == "sandbox":
            assert module == "launcher.sandbox.cli"
        else:  # launcher/cli/<command>.py, named after the command
            assert module == f"launcher.cli.{name.replace('-', '_')}" and attribute == name.replace("-", "_")
    in_sections = [name for _title, names in commands.SECTIONS for name in names]
    assert set(in_sections) == set(commands.COMMANDS)
    assert commands.SECTIONS[0] == ("First bring-up", ("init", "fetch", "check", "up"))  # the README's path
    assert commands.SECTIONS[-1][1] == ("sandbox",)
    assert main.get_command(ctx, "no-such") is None
    result = CliRunner().invoke(main, ["no-such"])
    assert result.exit_code == 2 and "No such command 'no-such'" in result.output


def test_help_lists_the_sections_in_order_and_starts_from_init():
    text = CliRunner().invoke(main, ["--help"], terminal_width=100).output
    heads = [line for line in text.splitlines() if line and not line.startswith(" ")]
    assert heads[2:] == [f"{title}:" for title, _ in commands.SECTIONS]  # after Usage and Options
    assert text.index("sparkstack init") < text.index("sparkstack fetch") < text.index("sparkstack check") < text.index("sparkstack up") \
        < text.index("sparkstack plan")
    listed = text[text.index("First bring-up:"):].splitlines()
    column = {line.index(line.split()[1]) for line in listed if line.startswith("  ")}
    assert len(column) == 1  # one aligned column across the sections


def test_cli_modules_are_small_and_never_import_the_sandbox():
    for path in sorted(CLI.glob("*.py")):
        assert len(path.read_text().splitlines()) <= 650, path
        for line, module, name in imports(path):
            target = kit_target(module, name) or ""
            assert not target.startswith("launcher.sandbox"), f"{path.name}:{line} imports {target}"
    assert not (CLI / "sandbox.py").exists() and (ROOT / "launcher" / "sandbox" / "cli.py").is_file()


# --- check's table --------------------------------------------------------------------------

def rank(r: int, *rows: Finding) -> RankReport:
    return RankReport(r, f"spark{r + 1}", list(rows))


PREP = "sparkstack prep"


def mixed_report() -> check.Report:
    """ssh passes and swap warns alike everywhere; memory fails on rank 1 only; sysctls warn on
    every rank, each with its own value; the api key row is rank 0's alone."""
    def rows(r):
        memory = (Finding("memory", Status.FAIL, "MemAvailable 10.0 GiB < needs 100.0 GiB", PREP) if r == 1 else
                  Finding("memory", Status.PASS, f"MemAvailable 11{r}.0 GiB"))
        return [Finding("ssh", Status.PASS, "ok"), memory,
                Finding("swap", Status.WARN, "8.0 GiB of swap on", PREP),
                Finding("sysctls", Status.WARN, f"vm.swappiness={60 + r} (want 1)", PREP)]

    ranks = [rank(r, *rows(r)) for r in range(4)]
    ranks[0].checks.append(Finding("api key", Status.WARN, "the API takes no key", "set overrides.api_key"))
    return check.Report(ranks, seconds=1.5)


def check_output(monkeypatch, tmp_path, report, *flags) -> list[str]:
    monkeypatch.setattr(preflight, "run", lambda loaded, **kw: report)
    result = CliRunner().invoke(main, ["check", "-c", str(sandbox_cluster(tmp_path).path), *flags])
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == (0 if report.ok else 1), result.output
    return result.output.splitlines()


def verdicts(lines: list[str]) -> list[str]:
    """The lines under the table (the table's rows start with a row name, not a verdict)."""
    first = next(i for i, line in enumerate(lines) if line.split()[0] in ("pass", "WARN", "FAIL"))
    return lines[first:]


def test_a_verdict_every_rank_shares_is_printed_once_with_the_ranks_named(monkeypatch, tmp_path):
    lines = check_output(monkeypatch, tmp_path, mixed_report())
    assert lines[0].split() == ["check", "0", "spark1", "1", "spark2", "2", "spark3", "3", "spark4"]
    assert next(x for x in lines if x.startswith("swap")).split() == ["swap", "WARN", "WARN", "WARN", "WARN"]
    assert verdicts(lines) == [
        "WARN ranks 0–3 swap: 8.0 GiB of swap on", f"     fix: {PREP}",
        "WARN rank 0 spark1 sysctls: vm.swappiness=60 (want 1)", f"     fix: {PREP}",
        "WARN rank 0 spark1 api key: the API takes no key", "     fix: set overrides.api_key",
        "FAIL rank 1 spark2 memory: MemAvailable 10.0 GiB < needs 100.0 GiB", f"     fix: {PREP}",
        "WARN rank 1 spark2 sysctls: vm.swappiness=61 (want 1)", f"     fix: {PREP}",
        "WARN rank 2 spark3 sysctls: vm.swappiness=62 (want 1)", f"     fix: {PREP}",
        "WARN rank 3 spark4 sysctls: vm.swappiness=63 (want 1)", f"     fix: {PREP}",
        "not ready (1.50 s)"]


def test_verbose_folds_shared_passes_too_and_keeps_each_ranks_own(monkeypatch, tmp_path):
    shown = verdicts(check_output(monkeypatch, tmp_path, mixed_report(), "-v"))
    assert shown[:4] == ["pass ranks 0–3 ssh: ok", "WARN ranks 0–3 swap: 8.0 GiB of swap on", f"     fix: {PREP}",
                         "pass rank 0 spark1 memory: MemAvailable 110.0 GiB"]
    assert [x for x in shown if " memory: " in x] == [
        "pass rank 0 spark1 memory: MemAvailable 110.0 GiB",
        "FAIL rank 1 spark2 memory: MemAvailable 10.0 GiB < needs 100.0 GiB",
        "pass rank 2 spark3 memory: MemAvailable 112.0 GiB", "pass rank 3 spark4 memory: MemAvailable 113.0 GiB"]
    assert [x for x in shown if " ssh: " in x] == ["pass ranks 0–3 ssh: ok"]


def test_json_keeps_every_ranks_rows(monkeypatch, tmp_path):
    report = mixed_report()
    monkeypatch.setattr(preflight, "run", lambda loaded, **kw: report)
    result = CliRunner().invoke(main, ["check", "-c", str(sandbox_cluster(tmp_path).path), "--json"])
    data = json.loads(result.output)
    assert data == report.to_json()
    assert [c["name"] for c in data["ranks"][3]["checks"]] == ["ssh", "memory", "swap", "sysctls"]


def test_what_counts_as_shared():
    """Same name, status, value and fix on every rank; a row some rank lacks, or has twice, is
    each rank's own; one rank alone shares nothing."""
    report = mixed_report()
    assert list(shared_verdicts(report)) == ["ssh", "swap"]
    report.ranks[2].checks[2] = Finding("swap", Status.WARN, "8.0 GiB of swap on", "another fix")
    assert list(shared_verdicts(report)) == ["ssh"]
    report.ranks[3].checks.append(Finding("ssh", Status.PASS, "ok"))
    assert list(shared_verdicts(report)) == []
    assert shared_verdicts(check.Report([rank(0, Finding("ssh", Status.PASS, "ok"))])) == {}
    unreachable = mixed_report()
    unreachable.ranks[1] = rank(1, Finding("ssh", Status.FAIL, "rank 1 (spark2): unreachable"))
    assert list(shared_verdicts(unreachable)) == []


def test_one_rank_is_named_as_before(monkeypatch, tmp_path):
    report = check.Report([rank(0, Finding("swap", Status.WARN, "8.0 GiB of swap on", PREP))], seconds=0.2)
    assert verdicts(check_output(monkeypatch, tmp_path, report)) == [
        "WARN rank 0 spark1 swap: 8.0 GiB of swap on", f"     fix: {PREP}", "ok (0.20 s)"]


def test_ranks_named():
    assert ranks_named([0, 1, 2, 3]) == "ranks 0–3"
    assert ranks_named([3, 2, 1]) == "ranks 1–3"
    assert ranks_named([0, 1]) == "ranks 0, 1"
    assert ranks_named([0, 2, 3]) == "ranks 0, 2, 3"


def test_build_on_ranks_prints_a_line_per_rank_and_names_the_failed(monkeypatch, tmp_path):
    """`build --on-ranks`' renderer, without the sandbox: each rank's state and stages built, each
    rank's error, and exit 1 naming the failed rank."""
    import contextlib
    import types

    from launcher.images import build as build_mod
    from launcher.transport import remote

    chain = types.SimpleNamespace(stages=[object(), object()], top="img:top")
    monkeypatch.setattr(build_mod, "local_chain", lambda loaded: chain)
    monkeypatch.setattr(remote.Group, "for_cluster", lambda *a, **kw: contextlib.nullcontext())
    monkeypatch.setattr(build_mod, "build_on_ranks", lambda loaded, chain, say, group: [
        build_mod.RankBuild(0, "spark1", Status.BUILT, [{"built": True}, {"built": True}], seconds=2.0),
        build_mod.RankBuild(1, "spark2", Status.FAILED, [{"built": True}], "rank 1 (spark2): no space", 1.0)])
    result = CliRunner().invoke(main, ["build", "-c", str(sandbox_cluster(tmp_path).path), "--on-ranks"])
    assert result.exit_code == 1, result.output
    assert result.output.splitlines() == [
        "rank 0 spark1  built   2 of 2 stages built (2.0 s)",
        "rank 1 spark2  failed  1 of 2 stages built (1.0 s)",
        "  error: rank 1 (spark2): no space",
        "error: build failed on 1 of 2 ranks (rank 1); fix the cause above and re-run: stages already built are kept"]
