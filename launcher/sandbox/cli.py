"""`sparkstack sandbox up | down | status [--json]`: the sandbox's own command group, which the
CLI names by its import string (launcher/cli/commands.py's table), so nothing outside sandbox/
imports sandbox/."""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from ..cli.console import err, friendly, make_table, out, plain, print_table

_friendly = friendly("interrupted; `sparkstack sandbox up` again resumes, "
                     "`sparkstack sandbox down` cleans up")


state_option = click.option(
    "--dir", "state_dir", metavar="PATH", type=click.Path(path_type=Path),
    help="sandbox state directory (default: $SPARKSTACK_SANDBOX_DIR, "
         "else ~/.local/state/sparkstack/sandbox)")


def _bare_option(fn):
    def use_bare(ctx, param, value):
        if value:  # every sandbox function reads it (links.bare()): names, subnet, state dir
            import os

            os.environ["SPARKSTACK_SANDBOX_BARE"] = "1"
        return value

    return click.option("--bare", is_flag=True, expose_value=False, callback=use_bare, is_eager=True,
                        help="the bare sandbox, beside the normal one (its own containers, subnet and "
                             "state dir): cables without addresses, no key installed, a password "
                             "login (in <state dir>/password) -- a Spark before `sparkstack init`")(fn)


def _progress(msg: str) -> None:
    err.print(f"[dim]sandbox:[/] {msg}", markup=True, highlight=False)


@click.group()
def sandbox():
    """Four simulated DGX Spark ranks on the local Docker engine (the demo and the test bed)."""


@sandbox.command()
@state_option
@_bare_option
@click.option("--ranks", type=int, default=None, metavar="N",
              help="how many ranks (default: $SPARKSTACK_SANDBOX_RANKS, else 4); ranks above N are removed")
@click.option("--topology", type=click.Choice(["ring", "switch"]), default=None,
              help="cable the fabric as a ring (two ports a rank, a /30 a link) or to one switch "
                   "(one port a rank, one /24); default: $SPARKSTACK_SANDBOX_TOPOLOGY, else ring")
@click.option("--stores", default=None, metavar="STORES",
              help="each rank's Docker image store: classic (overlay2), containerd (Docker 29+'s "
                   "default), mixed (the last rank on containerd), or one per rank, comma-separated; "
                   "default: $SPARKSTACK_SANDBOX_STORES, else mixed; a rank made with another is re-made")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
@_friendly
def up(state_dir, ranks, topology, stores, as_json):
    """Create the ranks (or adopt running ones), cable their fabric, and write cluster.yaml."""
    from . import cluster

    result = cluster.up(state_dir, progress=_progress, ranks=ranks, cabling=topology, docker_stores=stores)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    _print_ranks(result["ranks"])
    if os.environ.get("SPARKSTACK_SANDBOX_BARE") == "1":
        out.print(f"ready in {result['seconds']} s, cabled as a {result['topology']}, bare; the password "
                  f"of {result['ranks'][0]['user']} is in {Path(result['config']).parent / 'password'}; next: "
                  "sparkstack init " + " ".join(r["address"] for r in result["ranks"]))
        return
    out.print(f"ready in {result['seconds']} s, cabled as a {result['topology']}; the cluster config is:")
    click.echo(result["config"])


def _print_ranks(ranks, colour: bool = False) -> None:
    """A row per rank: its name, login and whether its dockerd answers (in colour for status)."""
    table = make_table()
    for r in ranks:
        docker = plain(f"docker {r['docker']}")
        if colour:
            docker.stylize("green" if r["docker"] == "running" else "red", len("docker "))
        table.add_row(plain(r["name"]), plain(f"{r['user']}@{r['address']}:{r['port']}"), docker)
    print_table(table)


@sandbox.command()
@state_option
@_bare_option
@click.option("--purge", is_flag=True, help="also delete the state directory (keys, checkpoint)")
@_friendly
def down(state_dir, purge):
    """Remove every container, network and volume the sandbox created (nothing else)."""
    from . import cluster

    removed = cluster.down(state_dir, purge=purge)
    n = sum(len(v) for v in removed.values())
    out.print(f"removed {len(removed['containers'])} containers, {len(removed['networks'])} "
              f"networks, {len(removed['volumes'])} volumes" if n else "nothing to remove")


@sandbox.command()
@state_option
@_bare_option
@click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")
@_friendly
def status(state_dir, as_json):
    """Each rank's address, login and whether its own dockerd answers."""
    from . import cluster

    result = cluster.status(state_dir)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    _print_ranks(result["ranks"], colour=True)
    cfg = Path(result["config"])
    out.print(f"config: {cfg}" + ("" if cfg.exists() else " (not written yet: `sparkstack sandbox up`)"))
