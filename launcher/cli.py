"""`sparkstack`: the command line. Each command is a thin layer over a module that does the work."""

from __future__ import annotations

import functools
import json
import shlex
import sys

import click
from rich.console import Console

from . import __version__
from . import config as config_mod
from . import plan as plan_mod
from .errors import SparkstackError
from .profile import load_profile, profile_names

err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)


def friendly_errors(fn):
    """Every failure a user can cause ends as one message and an exit code, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SparkstackError as e:
            for line in e.message.splitlines():
                err.print(f"[bold red]error:[/] {line}", markup=True, highlight=False)
            sys.exit(e.exit_code)

    return wrapper


config_option = click.option(
    "-c", "--config", "config_file", metavar="PATH",
    help="cluster config (default: $SPARKSTACK_CONFIG, else ./cluster.yaml)")
json_option = click.option("--json", "as_json", is_flag=True, help="print JSON for scripts")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sparkstack")
def main():
    """Bring one very large MoE model (GLM-5.3 EXL3) up on DGX Spark boxes with vLLM
    tensor parallelism, and back up after every reboot.

    \b
    A cluster is described by cluster.yaml (see env/cluster.example.yaml) and a serving
    profile from env/profiles/ (`sparkstack profiles` lists them). Start with:
      sparkstack plan -c cluster.yaml     what would run on each rank, and the KV sizing

    Exit codes: 0 ok, 1 a step failed on a rank, 2 bad input, 3 the plan does not fit.
    """


@main.command()
@config_option
@json_option
@click.option("--show-secrets", is_flag=True, help="print the API key instead of ***")
@friendly_errors
def plan(config_file, as_json, show_secrets):
    """Show what `up` would run on every rank, touching nothing.

    Per rank: the environment, the `docker run` argv, the engine argv (after `vllm serve`), and
    the KV sizing: bytes per token, the --kv-cache-memory-bytes to pass and the tokens that fit.
    Inputs that could not be read (the checkpoint, the ranks' memory) fall back on the profile's
    seed figures and a GB10's memory; they are listed under "assumed".
    """
    loaded = config_mod.load(config_mod.config_path(config_file))
    result = plan_mod.build(loaded)
    data = result.to_json(reveal_secrets=show_secrets)
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    _print_plan(loaded, result, data)


def _print_plan(loaded, result, data) -> None:
    out.print(f"[bold]profile[/] {loaded.profile.name}: {loaded.profile.description}")
    out.print(f"[bold]image[/]   {result.image}\n")
    for rank in data["ranks"]:
        out.print(f"[bold cyan]rank {rank['rank']}[/] {rank['host']}")
        out.print("  env     " + " ".join(f"{k}={shlex.quote(v)}" for k, v in rank["env"].items()))
        out.print("  run     " + shlex.join(rank["docker_run"] + rank["engine"]))
    sizing = result.kv
    if sizing:
        out.print(f"\n[bold]KV[/]      {sizing.bytes_per_token:,} B/token per rank, "
                  f"--kv-cache-memory-bytes {sizing.kv_cache_memory_bytes} "
                  f"({sizing.kv_cache_memory_bytes / 2**30:.1f} GiB) → {sizing.max_tokens:,} tokens")
        out.print(f"        budget: {sizing.budget.explain()}"
                  + (" (the profile's fixed figure is used)" if sizing.fixed else ""))
    if result.assumed:
        out.print("\n[bold yellow]assumed[/] (not read from the cluster):")
        for line in result.assumed:
            out.print(f"  - {line}")


@main.command()
@json_option
@friendly_errors
def profiles(as_json):
    """List the serving profiles in env/profiles/ (the seeds' recipes)."""
    rows = [load_profile(name) for name in profile_names()]
    if as_json:
        click.echo(json.dumps([{"name": p.name, "engine": p.engine, "seeds": p.seeds,
                                "description": p.description} for p in rows], indent=2))
        return
    for p in rows:
        out.print(f"[bold]{p.name}[/] ({p.engine}, seeds {', '.join(p.seeds)})\n  {p.description}")


def _register_optional_commands() -> None:
    """Command groups from modules that may grow independently (the sandbox)."""
    try:
        from .sandbox.cli import sandbox
    except ImportError:
        return
    main.add_command(sandbox)


_register_optional_commands()
