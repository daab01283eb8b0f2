"""`sparkstack status`: per rank the serving container, MemAvailable and compile caches; the API."""

from __future__ import annotations

import json

import click

from ..errors import SparkstackError
from .console import out
from .shared import json_option, print_ranks, trust_option, with_cluster


@click.command()
@with_cluster()
@json_option
@trust_option()
def status(loaded, as_json, trust_new_hosts):
    """Per rank: the serving container's state and uptime, the rank's MemAvailable now, its
    image, and the API on rank 0; each rank's memory guard while serving (watching or not, its
    latest cache drops and engine stops, with the figures); with a supervisor (`up --keep`), its
    restarts, the last cause it found and its settings (keep: in the config, liveness included);
    what changed on a rank since the last good start (link state, MTU, fabric address, the RoCE v2
    GID index NCCL picks, driver, image, MemAvailable well below)."""
    from ..transport import api
    from ..apply import deploy, engine_caches, last_good, prep, serve, servguard

    with deploy.group_for(loaded, trust_new_hosts, lambda line: None) as group:
        states = serve.states(group)
        reached = [s.rank for s in states if s.state != "unreachable"]
        mem = prep.read_mem_available(group, reached)
        cache = engine_caches.sizes(loaded, group, reached)
        guards = servguard.read(group) if reached else {}
        since = last_good.explain(loaded, group, states)
    ep = api.endpoint(loaded)
    from ..apply import supervisor

    available = {r: v if isinstance(v, int) else None for r, v in mem.items()}
    data = {"ranks": [{**s.to_json(), "mem_available": available.get(s.rank),
                       "compile_cache": cache.get(s.rank) if isinstance(cache.get(s.rank), dict) else None}
                      for s in states],
            "api": {"url": ep.url, "healthy": api.health(ep)},
            "keep": supervisor.summary(supervisor.log_path(loaded)),
            "keep_settings": loaded.cluster.keep.model_dump(),
            "memory_guard": [g.to_json() for _r, g in sorted(guards.items())],
            "since_last_good_start": since.to_json() if since else None}
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        print_ranks([_status_row(s, mem.get(s.rank), cache.get(s.rank)) for s in states])
        out.print(f"API {ep.url}: {'healthy' if data['api']['healthy'] else 'not answering'}")
        _print_guards(loaded, states, guards)
        if data["keep"]:
            k = data["keep"]
            out.print(f"supervisor (up --keep): {k['restarts']} restart(s)"
                      + (f"; last cause at {k['last_cause_at']}: {k['last_cause']}" if k["last_cause"] else ""),
                      markup=False)
            out.print(f"  settings: {loaded.cluster.keep.describe()}", markup=False)
        if since and since.changes:
            out.print(since.block(), markup=False)
    if all(s.state == "unreachable" for s in states):
        raise SparkstackError(f"no rank answered (all {len(states)} unreachable): nothing is known of the "
                              "cluster; check the ranks are up and reachable over SSH (`sparkstack check`)")


def _status_row(s, mem: int | str | None, cache: dict[str, int] | str | None = None) -> tuple:
    """A rank's row; why a rank is unreachable (or unknown) goes last, where a long text pushes
    no other column aside. `mem`: its MemAvailable, or why it could not be read; `cache`: its
    compile caches' bytes by image (engine_caches.sizes)."""
    from ..plan.kv import gib

    shown = "" if mem is None else f"MemAvailable {gib(mem) if isinstance(mem, int) else '?'}"
    if s.state in ("unreachable", "unknown"):
        return s.rank, s.host, s.state, shown, "", s.image, s.describe()
    kept = "" if cache is None else "compile cache " + (
        "?" if isinstance(cache, str) else _cache_size(sum(cache.values())) if cache else "empty")
    return (s.rank, s.host, s.describe(), shown, kept, s.image,
            f"since {s.started_at}" if s.state == "running" else "")


def _cache_size(n: int) -> str:
    """MiB, or KiB while a cache holds little more than the kit's marker ("0.0 MiB" read as empty)."""
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 // 10 else f"{n / 1024:.1f} KiB"


GUARD_EVENTS_SHOWN = 3  # per rank: the newest of its guard's events


def _print_guards(loaded, states, guards) -> None:
    """Each rank's memory guard while serving: watching or not, and its newest events."""
    from ..apply import servguard

    settings = loaded.cluster.memory_guard.serving
    if not settings.enabled or not guards:
        return
    out.print(f"memory guard while serving (on each rank, {servguard.GUARD_DIR}/{servguard.EVENTS}): "
              f"MemFree < {settings.soft_free_gib:g} GiB drops caches, MemAvailable < "
              f"{settings.hard_available_gib:g} GiB stops that rank's engine", markup=False)
    running = {s.rank for s in states if s.state == "running"}
    for r, g in sorted(guards.items()):
        shown = [e for e in g.events if e.get("event") in ("relief", "hard")][-GUARD_EVENTS_SHOWN:]
        state = g.error or ("watching" if g.watching else "NOT watching" if r in running else "idle (no engine)")
        said = g.error if g.error and g.error.startswith(g.host) else f"{g.host}: {state}"  # the error names it
        out.print(f"  {said}" + ("" if shown or g.error else "; no event"), markup=False)
        for e in shown:
            out.print(f"    {servguard.describe(e)}", markup=False)
