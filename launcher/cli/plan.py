"""`sparkstack plan`: what `up` would run on every rank, touching nothing."""

from __future__ import annotations

import json
import shlex

import click

from .. import redact
from ..errors import SparkstackError
from ..gather import here
from ..plan import cluster_plan
from .console import out
from .shared import json_option, with_cluster


@click.command()
@with_cluster(profile=True)
@json_option
@click.option("--show-secrets", is_flag=True,
              help="print the API key and secret-looking env values (*TOKEN*, *KEY*, ...) instead of ***")
@click.option("--offline", is_flag=True,
              help="do not probe the ranks: plan from the config and the profile alone")
def plan(loaded, as_json, show_secrets, offline):
    """Show what `up` would run on every rank, touching nothing.

    Per rank: the environment, the `docker run` argv, the engine argv (after `vllm serve`), and
    the KV sizing: bytes per token, the --kv-cache-memory-bytes to pass and the tokens that fit;
    the --gpu-memory-utilization that clears vLLM's startup guard, with its arithmetic per rank.
    The ranks are probed first (read-only, one command each) for their MemAvailable and their
    own fabric environment; ranks that do not answer within a few seconds are planned offline.
    Inputs that could not be read (the checkpoint, the ranks' memory) fall back on the profile's
    seed figures and a GB10's memory; they are listed under "assumed". The API key and every env
    value whose name looks secret (or is in overrides.secret_env) show as *** unless
    --show-secrets; `plan` reads the API key `up` generates but never makes it.
    --profile NAME plans NAME instead of the config's profile (so do build, ship and up).
    """
    facts, note = ({}, None) if offline else _probe_for_plan(loaded)
    result = cluster_plan.build(loaded, here.inputs(loaded, facts))
    if note:
        result.assumed.append(note)
    source = "config" if click.get_current_context().params["profile_name"] is None else "--profile"
    data = {"profile": {"name": loaded.profile.name, "source": source},
            **result.to_json(reveal_secrets=show_secrets), "keep": loaded.cluster.keep.model_dump(),
            "memory_guard_serving": loaded.cluster.memory_guard.serving.model_dump()}
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    _print_plan(loaded, result, data, show_secrets)


def _print_plan(loaded, result, data, show_secrets: bool) -> None:
    source = " (--profile)" if data["profile"]["source"] == "--profile" else ""
    out.print(f"[bold]profile[/] {loaded.profile.name}{source}: {loaded.profile.description}")
    out.print(f"[bold]image[/]   {result.image}")
    _print_api_key(result.api, show_secrets)
    for rank in data["ranks"]:
        out.print(f"[bold cyan]rank {rank['rank']}[/] {rank['host']}")
        out.print("  env     " + " ".join(f"{k}={v if v == redact.MASK else shlex.quote(v)}"
                                       for k, v in rank["env"].items()))
        out.print("  run     " + shlex.join(rank["docker_run"] + rank["engine"]))
        if rank["rank"] in result.load:
            out.print("  load    " + result.load[rank["rank"]].describe(), markup=False)
    sizing = result.kv
    if sizing:
        out.print(f"\n[bold]KV[/]      {sizing.bytes_per_token:,} B/token per rank, "
                  f"--kv-cache-memory-bytes {sizing.kv_cache_memory_bytes} "
                  f"({sizing.kv_cache_memory_bytes / 2**30:.1f} GiB) → {sizing.max_tokens:,} tokens")
        out.print(f"        budget: {sizing.budget.explain()}"
                  + (" (the profile's fixed figure is used)" if sizing.fixed else ""))
        _print_kv_policy(sizing, data["kv"])
    if result.guard:
        _print_guard(result.guard)
    _print_serving_guard(loaded.cluster.memory_guard.serving)
    out.print("\n[bold]keep[/]    ", end="")
    out.print(f"up --keep: {loaded.cluster.keep.describe()}", markup=False)
    if result.assumed:
        out.print("\n[bold yellow]assumed[/] (not read from the cluster):")
        for line in result.assumed:
            out.print(f"  - {line}")
    for line in result.notes:
        out.print("\n[bold]note[/]    ", end="")
        out.print(line, markup=False)


def _print_kv_policy(sizing, kv_json) -> None:
    """The pool's policy and target, then each rank's memory expected free while serving."""
    target = sizing.target
    aim = f"target {target.tokens:,} tokens from {target.source}" if target else "the profile states no target"
    out.print(f"        policy: {sizing.policy} ({aim})", markup=False)
    out.print(f"[bold]free[/]    while serving, MemAvailable − weights − runtime − KV (floor "
              f"{kv_json['free_floor'] / 2**30:.1f} GiB; the seeds keep ~9–15 GB):")
    b = sizing.budget
    for row in kv_json["per_rank"]:
        out.print(f"        rank {row['rank']}: {row['mem_available'] / 2**30:.1f} − {b.weights / 2**30:.1f} − "
                  f"{b.runtime_overhead / 2**30:.1f} − {row['kv_cache_memory_bytes'] / 2**30:.1f} = "
                  f"{row['free_while_serving'] / 2**30:.1f} GiB")


def _print_api_key(key, reveal: bool) -> None:
    out.print("[bold yellow]api key[/] " if key.warning else "[bold]api key[/] ", end="")
    out.print(key.describe(reveal) + "\n", markup=False)


def _print_guard(guard) -> None:
    """vLLM's startup guard per rank: free at start must cover MemTotal × utilisation."""
    shown = guard.utilization if guard.utilization is not None else "none fits"
    whose = {"plan": "planned", "profile": "the profile's", "config": "cluster.yaml's"}[guard.source]
    out.print(f"\n[bold]guard[/]   --gpu-memory-utilization {shown} ({whose}; with margin "
              f"{guard.margin} every rank clears up to {guard.highest}): vLLM refuses to start "
              "when free < MemTotal × utilisation")
    for g in guard.ranks:
        out.print(f"        rank {g.rank}: {g.explain()}", markup=False)
    if guard.note:
        out.print(f"        [yellow]note[/]: {guard.note}")


def _print_serving_guard(settings) -> None:
    """What watches each rank's memory once the API answers (launcher/apply/servguard.py)."""
    if not settings.enabled:
        out.print("\n[bold]watch[/]   no memory guard while serving (memory_guard.serving.enabled: false)")
        return
    out.print(f"\n[bold]watch[/]   while serving, on every rank (memory_guard.serving, every {settings.interval_s:g} s): "
              f"MemFree < {settings.soft_free_gib:g} GiB drops page caches and compacts memory; "
              f"MemAvailable < {settings.hard_available_gib:g} GiB stops that rank's engine (the box stays up)")


PLAN_PROBE_TIMEOUT_S = 3.0  # `plan` is a look, not a preflight: it never waits long for a rank


def _probe_for_plan(loaded):
    """Facts of the ranks that answer, and the `assumed` line for those that do not (None when
    all answered). Never fails: an unreachable cluster gives the offline plan."""
    from ..gather import probe

    timeout = min(PLAN_PROBE_TIMEOUT_S, float(loaded.cluster.ssh.connect_timeout_s))
    try:
        with probe.open_group(loaded, connect_timeout=timeout) as group:
            found = probe.gather(group, loaded)
    except SparkstackError as e:  # e.g. a config the SSH layer refuses: plan offline
        return {}, f"ranks not probed ({e.message.splitlines()[0]}); `--offline` skips the attempt"
    missing = [f"rank {r} ({g.host})" for r, g in found.items() if g.facts is None]
    if not missing:
        return probe.facts_of(found), None
    return probe.facts_of(found), (
        f"ranks not probed (no answer within {timeout:.0f} s: {', '.join(missing)}): planned "
        "from the config alone; `sparkstack check` says why, `--offline` skips the attempt")
