"""What the commands share: their common options (-c/--config, --json, --profile,
--trust-new-hosts, --wait-lock), `with_cluster` (the config read and cross-checked, failures made
friendly) and the per-rank table every rank-by-rank command prints."""

from __future__ import annotations

import functools
import json

import click

from ..inputs import config as config_mod
from .console import friendly, friendly_errors, make_table, out, plain, print_table


config_option = click.option(
    "-c", "--config", "config_file", metavar="PATH",
    help="cluster config (default: $SPARKSTACK_CONFIG, else ./cluster.yaml)")
json_option = click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")
profile_option = click.option(
    "--profile", "profile_name", metavar="NAME",
    help="use this profile instead of the config's `profile:` (`sparkstack profiles` lists them)")


def trust_option(when: str = ""):
    """--trust-new-hosts; `when` says when it applies, if not always."""
    return click.option("--trust-new-hosts", is_flag=True,
                        help=f"{when}accept and record host keys not yet in known_hosts")


lock_option = click.option(
    "--wait-lock", "wait_lock", type=click.FloatRange(min=0), default=0, metavar="SECONDS",
    help="when another up/down/ship/prep/stage holds the cluster lock, wait this long for it (default: refuse at once)")


def with_cluster(profile: bool = False, interrupted: str | None = None):
    """Put right under @click.command(): adds -c/--config (and --profile, where a command takes
    one) and hands the command `loaded`, the config read and cross-checked, instead; failures,
    the config's and the command's, end as friendly_errors ends them (Ctrl+C saying
    `interrupted`, where given)."""

    def decorate(fn):
        @functools.wraps(fn)
        def run(config_file, profile_name=None, **kwargs):
            return fn(config_mod.load(config_mod.config_path(config_file), profile_name), **kwargs)

        run = friendly(interrupted)(run) if interrupted else friendly_errors(run)
        if profile:  # listed last in --help, as it always was
            profile_option(run)
            run.__click_params__.insert(0, run.__click_params__.pop())
        return config_option(run)  # listed first

    return decorate


def print_ranks(rows, errors=()) -> None:
    """A per-rank table without a header, its first column `rank R HOST` (what the other cells
    are needs no naming), then each rank's error."""
    table = make_table()
    for rank, host, *cells in rows:
        table.add_row(plain(f"rank {rank} {host}"), *map(plain, cells))
    print_table(table)
    print_errors(errors)


def print_errors(errors) -> None:
    """Each rank's error under its table (its text names the rank)."""
    for error in filter(None, errors):
        out.print("  [bold red]error:[/] ", end="")
        out.print(error, markup=False)


def show_or_refuse(plan, lines, as_json: bool, dry_run: bool, refused: str = "") -> bool:
    """A copy's plan (stage, fetch) with --dry-run or when it refuses: printed (its `lines`, or its
    JSON), then its refusals raised after `refused`. True when the command is done here."""
    from ..errors import SparkstackError

    refusals = plan.refusals()
    if not (dry_run or refusals):
        return False
    if as_json:
        click.echo(json.dumps({"plan": plan.to_json()}, indent=2))
    else:
        for line in lines(plan):
            out.print(line, markup=False, highlight=False)
    if refusals:
        raise SparkstackError(refused + "\n".join(refusals))
    return True
