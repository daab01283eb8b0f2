"""`sparkstack`: the command line. Each command is a module of its own in this folder (its
options, one call into the layers below, its renderer), loaded by name only when it is run or
listed: COMMANDS maps a command's name to its "module:attribute", SECTIONS orders them as an
owner uses them, and `sparkstack --version` imports no command at all."""

from __future__ import annotations

import importlib

import click

from .. import __version__

# name -> "module:attribute" of its click command, in the order `sparkstack --help` lists them.
COMMANDS = {
    "init": "launcher.cli.init:init",
    "fetch": "launcher.cli.fetch:fetch",
    "check": "launcher.cli.check:check",
    "up": "launcher.cli.up:up",
    "prep": "launcher.cli.prep:prep",
    "wait": "launcher.cli.wait:wait",
    "verify": "launcher.cli.verify:verify",
    "status": "launcher.cli.status:status",
    "logs": "launcher.cli.logs:logs",
    "down": "launcher.cli.down:down",
    "upgrade": "launcher.cli.upgrade:upgrade",
    "rollback": "launcher.cli.rollback:rollback",
    "history": "launcher.cli.history:history",
    "systemd-unit": "launcher.cli.systemd_unit:systemd_unit",
    "plan": "launcher.cli.plan:plan",
    "profiles": "launcher.cli.profiles:profiles",
    "build": "launcher.cli.build:build",
    "ship": "launcher.cli.ship:ship",
    "stage": "launcher.cli.stage:stage",
    "manifest": "launcher.cli.manifest:manifest",
    "bench": "launcher.cli.bench:bench",
    "metrics": "launcher.cli.metrics:metrics",
    "top": "launcher.cli.top:top",
    "api-key": "launcher.cli.api_key:api_key",
    "ansible-inventory": "launcher.cli.ansible_inventory:ansible_inventory",
    "registry-prune": "launcher.cli.registry_prune:registry_prune",
    "restore": "launcher.cli.restore:restore",
    "sandbox": "launcher.sandbox.cli:sandbox",  # the sandbox's own group: named, never imported here
}

# `sparkstack --help`'s sections: the README's path first (init -> fetch -> check -> up), then what runs
# after every boot, then day to day, then the sandbox to try it on. A command may be in two.
SECTIONS = (
    ("First bring-up", ("init", "fetch", "check", "up")),
    ("After every boot, and the running cluster", ("up", "prep", "wait", "verify", "status", "top", "logs",
                                                   "down", "upgrade", "rollback", "history", "metrics",
                                                   "systemd-unit")),
    ("Day to day", ("plan", "profiles", "build", "ship", "stage", "manifest", "bench", "api-key",
                    "ansible-inventory", "registry-prune", "restore")),
    ("Try it without Sparks", ("sandbox",)),
)


class LazyGroup(click.Group):
    """click's "lazily loading subcommands" group: `lazy_subcommands` names each command by
    "module:attribute", imported when the command is looked up (to run it, or to list it in
    --help), which --help lists in `sections`."""

    def __init__(self, *args, lazy_subcommands: dict[str, str], sections=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy_subcommands = lazy_subcommands
        self.sections = sections

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *self.lazy_subcommands]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_subcommands:
            return self._lazy_load(cmd_name)
        return super().get_command(ctx, cmd_name)

    def _lazy_load(self, cmd_name: str) -> click.Command:
        module, _, attribute = self.lazy_subcommands[cmd_name].partition(":")
        command = getattr(importlib.import_module(module), attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{self.lazy_subcommands[cmd_name]} is not a click command")
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """One section per entry of `sections` (their names in one aligned column), then any
        command no section names under "Commands"."""
        named = {name for _title, names in self.sections for name in names}
        sections = [*self.sections, ("Commands", tuple(n for n in self.list_commands(ctx) if n not in named))]
        shown = {n: c for n in self.list_commands(ctx) if (c := self.get_command(ctx, n)) and not c.hidden}
        if not shown:
            return
        width = max(map(len, shown))
        limit = formatter.width - 6 - width
        for title, names in sections:
            rows = [(n.ljust(width), shown[n].get_short_help_str(limit)) for n in names if n in shown]
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


@click.group(cls=LazyGroup, lazy_subcommands=COMMANDS, sections=SECTIONS,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sparkstack")
def main():
    """Bring one very large MoE model (GLM-5.3 EXL3) up on DGX Spark boxes with vLLM
    tensor parallelism, and back up after every reboot.

    \b
    A new cluster is four commands, `init` → `fetch` → `check` → `up`:
      sparkstack init spark1 spark2 spark3 spark4 --user spark
      sparkstack fetch drowzeys/keys-GLM-5.3-EXL3-2.75BPW   # the checkpoint, once
      sparkstack check
      sparkstack up
    and `up` again after every boot (`sparkstack systemd-unit` makes that automatic).

    To try it without Sparks: `sparkstack sandbox up` starts four simulated ranks on the local
    Docker engine and prints the cluster.yaml it wrote: set SPARKSTACK_CONFIG to it (or pass -c)
    and run the commands on it (./scripts/demo runs plan, build, ship, check, up, status, bench);
    `sparkstack sandbox up --bare` gives ranks as they are before `init`.

    A cluster is described by cluster.yaml (`init` writes it; see env/cluster.example.yaml) and a
    serving profile from env/profiles/ (`sparkstack profiles` lists them); `sparkstack plan`
    shows what `up` would run on each rank, and the KV sizing, touching nothing.

    Exit codes: 0 ok, 1 a step failed on a rank, 2 bad input, 3 the plan does not fit.
    """
