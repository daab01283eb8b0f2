"""`sparkstack`: the command line. Each command is a thin layer over a module that does the work."""

from __future__ import annotations

import functools
import json
import shlex
import sys

import click

from .. import __version__
from .. import redact
from ..errors import SparkstackError
from ..inputs import config as config_mod
from ..inputs.profile import load_profile, profile_names
from ..check import plan_inputs
from ..status import Status
from .console import err, friendly, friendly_errors, make_table, out, plain, print_table

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
    """Put right under @main.command(): adds -c/--config (and --profile, where a command takes
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
    result = plan_inputs.build_plan(loaded, facts)
    if note:
        result.assumed.append(note)
    source = "config" if click.get_current_context().params["profile_name"] is None else "--profile"
    data = {"profile": {"name": loaded.profile.name, "source": source},
            **result.to_json(reveal_secrets=show_secrets)}
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


def _bench_values(kind: str):
    """A click callback parsing a flag's value with launcher.bench.run (imported when used: httpx
    stays out of every other command's start-up)."""

    def parse(ctx, param, value):
        from ..bench import run as bench_mod

        if value is None:
            return None if kind == "url" else ()
        try:
            if kind == "url":
                return bench_mod.normalize_url(value)
            if kind == "tasks":
                tasks = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
                bench_mod.check_tasks(tasks, bench_mod.load_prompts())
                if not tasks:
                    raise ValueError("name at least one task")
                return tasks
            if kind == "counts":
                return bench_mod.parse_counts(value)
            return bench_mod.parse_sizes(value)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None

    return parse


@main.command()
@config_option
@json_option
@click.option("--url", metavar="URL", callback=_bench_values("url"),
              help="bench this OpenAI-compatible server (http://HOST:PORT) instead of the "
                   "config's rank 0; the config is then read only if -c is given")
@click.option("--api-key", envvar="SPARKSTACK_API_KEY", metavar="KEY",
              help="bearer key (default: $SPARKSTACK_API_KEY, else the config's: `sparkstack api-key`)")
@click.option("--model", metavar="NAME",
              help="served model name (default: the config's, else the first the server lists)")
@click.option("--tasks", metavar="TASKS", default="prose,code,list,essay", show_default=True,
              callback=_bench_values("tasks"), help="fixed prompts to run, comma-separated")
@click.option("--concurrency", metavar="N,N,..", default="1,2,4,8", show_default=True,
              callback=_bench_values("counts"), help="concurrent streams per measurement")
@click.option("--max-tokens", type=click.IntRange(min=1), default=256, show_default=True,
              help="output tokens per request")
@click.option("--temperature", type=click.FloatRange(min=0), default=None,
              help="default: the profile's bench.temperature, else 0.6 (seed 000)")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=None,
              help="default: the profile's bench.top_p, else 0.95 (seed 000)")
@click.option("--thinking/--no-thinking", default=False, show_default=True,
              help='GLM-5.3 reasoning: chat_template_kwargs {"reasoning_effort": "high"/"low"}')
@click.option("--needle", metavar="SIZES", callback=_bench_values("sizes"),
              help="also a needle test per prompt size, e.g. 8k,32k,128k (k = 1000 tokens)")
@click.option("--needle-at", type=click.FloatRange(0, 1), default=0.5, show_default=True,
              help="where the fact sits in the filler: 0 = start, 1 = end")
@click.option("--timeout", type=click.FloatRange(min=1), default=900, show_default=True,
              help="seconds of silence tolerated within a request (a deep prefill is silent)")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=".",
              help="directory for the JSON and PNG  [default: current directory]")
@friendly_errors
def bench(config_file, as_json, url, api_key, model, tasks, concurrency, max_tokens, temperature,
          top_p, thinking, needle, needle_at, timeout, out_dir):
    """Measure decode tok/s, TTFT and speculative acceptance, like the seeds' tables.

    \b
    For each task and concurrency level, after one warm-up request: per-stream (median) and
    aggregate (summed) decode tok/s = completion tokens ÷ (wall − TTFT), TTFT median and p90,
    and accepted tokens/step from vLLM's /metrics when it exposes spec-decode counters.
    --needle adds a long-prompt retrieval test with prefill tok/s per size.
    Writes sparkstack-bench-<time>.json and .png to --out. Ctrl+C stops and keeps what was
    measured. Exit codes: 0 ok, 1 the server failed (results so far are kept), 2 bad input,
    130 interrupted.
    """
    import pathlib

    from ..bench import run as bench_mod
    from ..bench import report as bench_report

    loaded = _bench_config(config_file, url)
    if loaded:
        target = bench_mod.target_from_config(loaded, url, api_key, model)
    else:
        target = bench_mod.Target(url, model, api_key)
    default_temperature, default_top_p = bench_mod.profile_sampling(loaded and loaded.profile)
    settings = bench_mod.Settings(
        tasks=tasks, concurrency=concurrency, max_tokens=max_tokens,
        temperature=default_temperature if temperature is None else temperature,
        top_p=default_top_p if top_p is None else top_p, thinking=thinking, needle=needle,
        needle_position=needle_at, timeout_s=timeout)
    results = _measure_with_progress(bench_mod, target, settings)
    paths = bench_report.write_files(results, pathlib.Path(out_dir)) if results.started else []
    if as_json:
        click.echo(json.dumps(results.to_json(), indent=2))
    else:
        _print_bench(bench_report, results)
    for path in paths:
        err.print(f"wrote {path}")
    if results.status == Status.FAILED:
        raise bench_mod.BenchError(results.error)
    if results.status == Status.INTERRUPTED:
        sys.exit(130)


def _print_bench(bench_report, results) -> None:
    if results.cells:
        out.print(bench_report.tok_s_table(results))
    if results.needles:
        out.print(bench_report.needle_table(results))
    for note in results.notes():
        out.print(f"[yellow]note:[/] {note}")
    kept = "the results above are what completed" if results.cells or results.needles else \
        "nothing had completed"
    if results.status == Status.INTERRUPTED:
        out.print(f"[yellow]stopped by Ctrl+C:[/] {kept}")
    elif results.status == Status.FAILED:
        out.print(f"[yellow]the run failed:[/] {kept}")


def _bench_config(config_file, url):
    """The cluster config bench reads: always without --url, with --url only if -c names one."""
    if url and not config_file:
        return None
    path = config_mod.config_path(config_file)
    if not path.exists():
        raise config_mod.ConfigError([f"{path}: no such cluster config file; pass -c PATH, or "
                                      "--url http://HOST:PORT to bench any OpenAI-compatible "
                                      "server"])
    return config_mod.load(path)


def _measure_with_progress(bench_mod, target, settings):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description:<14}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("requests"), TimeElapsedColumn())
    # Off when stderr is not a terminal: a log file gets the results, not a redrawn bar.
    with Progress(*columns, console=err, transient=True, disable=not err.is_terminal) as progress:
        bar = progress.add_task(f"connecting to {target.url}", total=settings.total_requests)
        return bench_mod.measure(
            target, settings, lambda what, n: progress.update(bar, description=what, advance=n))


@main.command()
@with_cluster(profile=True)
@json_option
@click.option("--render-only", "render_dir", metavar="DIR", type=click.Path(file_okay=False),
              help="write each stage's build context (Dockerfile + files) under DIR/<stage>/ "
                   "and build nothing")
@click.option("-v", "--verbose", is_flag=True, help="print Docker's build output as it comes")
@click.option("--on-ranks", is_flag=True,
              help="build the chain on every rank's Docker over SSH instead (each rank needs the base)")
@trust_option(when="with --on-ranks: ")
def build(loaded, as_json, render_dir, verbose, on_ranks, trust_new_hosts):
    """Build the profile's image chain (e.g. dcp → mul1 → v145 → keys) on the local Docker.

    \b
    Each stage's tag is a hash of its rendered Dockerfile, the patch files it copies (from
    cluster.yaml images.patches_dir), its build args and its parent's tag, so only changed
    stages and the stages after them are built; an unchanged chain builds nothing. A stage,
    parent, patch file or template problem is refused before anything is built.
    --json prints {"stages": [{"name", "tag", "image_id", "built", "seconds"}]}.
    --on-ranks sends each rank only the stages' build contexts (a few KB) and builds there, all
    ranks in parallel; --json then prints {"ranks": [{"rank", "host", "status", "stages",
    "error", "seconds"}]}.
    """
    import pathlib

    from ..images import build as build_mod
    from ..images import images as images_mod
    from ..images import local_docker

    base = images_mod.base_name(loaded)
    # every check before anything is built; the base's ID (a lookup) only when Docker has it
    chain = build_mod.local_chain(loaded)
    if render_dir:
        images_mod.write_contexts(chain, pathlib.Path(render_dir))
        _print_build(as_json, [{"name": s.name, "tag": s.tag, "dockerfile":
                                str(pathlib.Path(render_dir) / s.name / "Dockerfile")} for s in chain.stages])
        return
    if on_ranks:
        return _build_on_ranks(build_mod, loaded, chain, as_json, trust_new_hosts)
    if not chain.stages:
        _print_build(as_json, [], f"profile {loaded.profile.name} uses {chain.base.name} as it is: "
                                  f"nothing to build")
        return
    engine = local_docker.connect()
    show = _BuildDisplay(verbose and not as_json, quiet=as_json)
    if chain.base.image_id is None:  # pulled first: the tags hash its ID
        chain = images_mod.chain_for(loaded, build_mod.ensure_base(engine, base, show).image_id)
    with show:
        results = build_mod.build_chain(engine, chain, show)
    _print_build(as_json, [r.to_json() for r in results], f"image {chain.top}")


def _build_on_ranks(build_mod, loaded, chain, as_json: bool, trust_new_hosts: bool) -> None:
    from ..transport import remote

    with remote.Group.for_cluster(loaded.cluster, trust_new=trust_new_hosts, say=err.print) as group:
        ranks = build_mod.build_on_ranks(loaded, chain, say=lambda line: err.print(line, markup=False),
                                         group=group)
    if as_json:
        click.echo(json.dumps({"ranks": [r.to_json() for r in ranks]}, indent=2))
    else:
        _print_ranks([(r.rank, r.host, r.status, f"{sum(s['built'] for s in r.stages)} of "
                       f"{len(chain.stages)} stages built ({r.seconds:.1f} s)") for r in ranks],
                     [r.error for r in ranks])
    failed = [r for r in ranks if r.status == Status.FAILED]
    if failed:
        raise build_mod.BuildError(f"build failed on {len(failed)} of {len(ranks)} ranks "
                                   f"({', '.join(f'rank {r.rank}' for r in failed)}); fix the cause "
                                   f"above and re-run: stages already built are kept")


def _print_build(as_json: bool, stages: list[dict], summary: str = "") -> None:
    if as_json:
        click.echo(json.dumps({"stages": stages}, indent=2))
        return
    rows = make_table()
    for s in stages:
        state = "" if "built" not in s else ("built" if s["built"] else "up to date")
        timing = f" {s['seconds']:.1f}s" if s.get("built") else ""
        where = f"→ {s['dockerfile']}" if "dockerfile" in s else ""
        rows.add_row(plain(s["name"]), plain(s["tag"]), plain(f"{state}{timing}{where}"))
    print_table(rows)
    if summary:
        out.print(summary)


class _BuildDisplay:
    """build's progress on stderr: a line per stage (spinner and step while it builds); with
    --verbose Docker's own output too."""

    def __init__(self, verbose: bool, quiet: bool):
        self.verbose, self.quiet, self.tasks, self.progress = verbose, quiet, {}, None

    def __enter__(self):
        if not self.quiet:  # rich.progress only when shown: a no-op build stays fast
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                     TimeElapsedColumn(), console=err, transient=True,
                                     disable=not err.is_terminal)
            self.progress.start()
        return self

    def __exit__(self, *exc):
        if self.progress:
            self.progress.stop()

    def __call__(self, event) -> None:
        if self.quiet or (self.progress is None and event.kind != "pull"):
            return
        if event.kind == "pull":
            err.print(event.text)
        elif event.kind == "start":
            self.tasks[event.stage] = self.progress.add_task(f"{event.stage}: building {event.text}")
        elif event.kind == "step" and event.stage in self.tasks:
            self.progress.update(self.tasks[event.stage],
                                 description=f"{event.stage}: step {event.step}/{event.steps} {event.text[:60]}")
        elif event.kind == "log" and self.verbose:
            self.progress.console.print(f"  {event.stage} | {event.text}", markup=False)
        elif event.kind == "done" and event.stage in self.tasks:
            self.progress.remove_task(self.tasks.pop(event.stage))


@main.command()
@with_cluster(profile=True)
@json_option
@click.option("--image", "refs", multiple=True, metavar="REF",
              help="ship this image (repeatable; default: the profile's serving image)")
@click.option("--dry-run", is_flag=True, help="say which rank lacks what, move nothing")
@trust_option()
@click.option("--relay", is_flag=True,
              help="ranks pull from a cache on rank 0: the uplink carries each blob twice, not once per rank")
@lock_option
def ship(loaded, as_json, refs, dry_run, trust_new_hosts, relay, wait_lock):
    """Send every rank the images it lacks, and only those.

    \b
    Each rank is asked (by image ID) what it already has, and which layers. This host reads each
    image once (`docker save`, kept in ~/.cache/sparkstack/spool) and streams into every rank's
    `docker load`, over its SSH connection, only the layers it lacks (uncompressed), each rank at
    once, with progress (moved of missing, rate, ETA). A rank gets the image's tag only once its
    image ID equals this host's. --relay: every rank pulls from a registry cache on rank 0
    instead, fed by a registry on this host (both Debian's docker-registry), so this host's
    uplink carries each missing blob twice in all (the cache's fetch and store), not once per
    rank; `bytes` then shows the uplink's bytes on rank 0. A layer that came by a plain ship has
    no registry digest on the rank: the first relayed pull over it moves it once more.
    --json prints {"ranks": [{"rank", "host", "images", "bytes", "missing", "seconds", "status",
    "error"}]}.
    """
    from ..images import build as build_mod
    from ..images import relay as relay_mod
    from ..transport import remote
    from ..images import ship as ship_mod
    from ..apply import cluster_lock

    refs = refs or [build_mod.local_chain(loaded).top]
    ids = ship_mod.local_image_ids(list(refs))  # Docker's socket, without docker-py
    with remote.Group.for_cluster(loaded.cluster, trust_new=trust_new_hosts, say=err.print) as group:
        shipment = ship_mod.make_plan(group, ids)
        if not dry_run:
            say = lambda line: err.print(line, markup=False)  # noqa: E731
            with cluster_lock.held(loaded, group, wait_lock, say):
                ship_mod.apply(shipment, group, say=say, relay=relay_mod.route(loaded) if relay else None)
    rows = [r.to_json() for r in shipment.ranks]
    if as_json:
        click.echo(json.dumps({"ranks": rows}, indent=2))
    else:
        _print_ranks([(r["rank"], r["host"], r["status"], _what_shipped(r)) for r in rows],
                     [r["error"] for r in rows])
    failed = [r for r in shipment.ranks if r.status == Status.FAILED]
    if failed:
        raise SparkstackError(f"ship failed on {len(failed)} of {len(rows)} ranks "
                              f"({', '.join(f'rank {r.rank}' for r in failed)}); fix the cause above "
                              "and re-run `sparkstack ship`: only what is missing moves")


def _what_shipped(rank: dict) -> str:
    from ..images.ship import RankShip, moved

    what = ", ".join(rank["images"]) or "nothing"
    if rank["status"] == Status.SHIPPED or rank["missing"]:
        what += f" ({moved(RankShip(**rank))})"
    return what


@main.command("registry-prune")
@friendly_errors
def registry_prune():
    """Empty this host's registry storage (~/.cache/sparkstack/registry) and the spool of saved
    images (~/.cache/sparkstack/spool).

    \b
    `ship --relay` keeps every image it pushed in the registry storage, so an unchanged layer is
    not pushed twice; `ship` keeps the layers of the last few images it saved in the spool, so a
    re-ship reads nothing again. Pruning frees both; the next ship reads or pushes its images
    again (on this host: the ranks still receive only the layers they lack). Refused while a
    relayed ship runs; a plain ship running meanwhile fails on the ranks still receiving.
    """
    from ..images import registry, spool

    freed = registry.prune()
    out.print(f"registry storage emptied: {freed / 1e9:.2f} GB freed", markup=False)
    freed = spool.prune()
    out.print(f"spool emptied: {freed / 1e9:.2f} GB freed", markup=False)


@main.command("ansible-inventory")
@with_cluster()
@click.option("--format", "fmt", type=click.Choice(["ini", "yaml"]), default="ini",
              show_default=True, help="inventory file format")
def ansible_inventory(loaded, fmt):
    """Print an Ansible inventory of the ranks for ansible/spark.yml.

    \b
    Hosts in rank order, reached as sparkstack reaches them (address, port, user, key, jump
    host; host keys checked against the config's known_hosts), with the node settings of
    launcher/inputs/node_settings.py as group vars. Apply the persistent node settings with:
      sparkstack ansible-inventory -c cluster.yaml > inventory.ini
      ANSIBLE_CONFIG=ansible/ansible.cfg ansible-playbook -i inventory.ini ansible/spark.yml
    """
    from ..inputs.config import no_swap
    from ..plan import inventory

    click.echo(inventory.render(loaded.cluster, fmt, no_swap(loaded)), nl=False)


@main.command()
@with_cluster(profile=True)
@json_option
@trust_option()
@lock_option
@click.option("--restart", is_flag=True, help="start again even if already running as planned")
@click.option("--keep", is_flag=True,
              help="then keep it serving: watch every rank and the API, re-deploy on a failure (keep: in the config)")
@click.option("--timeout", "wait_timeout", type=click.FloatRange(min=1), default=900, show_default=True,
              help="seconds to wait for the API once started (longer when the slowest rank's cold-load estimate x 2 is; see `check`'s load row)")
def up(loaded, as_json, trust_new_hosts, wait_lock, restart, keep, wait_timeout):
    """The whole (re-)deploy, e.g. after a boot: prepare the nodes, check every rank, build and
    ship only what a rank lacks, start TP vLLM (workers, then the head), wait for the API.

    \b
    While the engines load, a watcher on every rank drops page caches below the soft floor
    of MemFree and stops the cluster below the hard floor of MemAvailable (memory_guard in
    the config); `up` prints each rank's lowest MemAvailable (--json: the whole timeline).
    A failed check starts nothing. If any rank fails to start, every rank is stopped and each
    failed rank is shown with its exit code and last log lines. A cluster already running as
    planned is left alone: `up` then changes nothing (use --restart to force).
    Ctrl+C, SIGTERM or SIGHUP: the containers this run started are stopped (exit 130); a
    second one exits without waiting for that.
    --keep: after that, watch every rank's container and the API (keep.check_interval_s); on a
    failure, re-deploy on every rank after a backoff (keep.backoff_s, doubling), and give up with
    every rank stopped after keep.max_restarts_per_hour. Events go to a log `status` reads, and
    a Prometheus textfile beside it. Ctrl+C/SIGTERM while watching leaves the cluster serving.
    """
    from ..apply import cluster_lock, deploy

    say = lambda line: err.print(line, markup=False)  # noqa: E731
    if keep:
        return _keep(loaded, trust_new_hosts, wait_lock, wait_timeout, say)
    with deploy.group_for(loaded, trust_new_hosts, say) as group, cluster_lock.held(loaded, group, wait_lock, say):
        report = deploy.up(loaded, group, restart=restart, wait_timeout=wait_timeout, say=say)
    from ..transport import api

    ep = api.endpoint(loaded)
    for memory in report.memory:
        say("  memory while loading: " + memory.summary())
    if as_json:
        click.echo(json.dumps({"serving": loaded.profile.name, "url": ep.url, **report.to_json()}, indent=2))
        return
    out.print(f"serving {loaded.profile.name} at {ep.url} "
              f"({'started' if report.changed else 'unchanged'}, {report.seconds:.1f} s)")
    _say_how_to_authenticate(loaded)


def _keep(loaded, trust_new_hosts, wait_lock, wait_timeout, say) -> None:
    from ..apply import cluster_lock, deploy, supervisor

    log = supervisor.EventLog(supervisor.log_path(loaded))
    say(f"supervising {loaded.profile.name}: events in {log.path}, metrics in {log.path.with_suffix('.prom')}")
    with deploy.group_for(loaded, trust_new_hosts, say) as group, cluster_lock.held(loaded, group, wait_lock, say):
        supervisor.Supervisor(loaded, group, log, wait_timeout, say).run()


def _say_how_to_authenticate(loaded) -> None:
    from ..inputs import apikey

    key = apikey.resolve(loaded)
    if key.warning:
        err.print(f"[yellow]WARN[/] {key.warning}")
    else:
        err.print("clients send `Authorization: Bearer KEY`; `sparkstack api-key` prints KEY", markup=False)


@main.command()
@with_cluster()
@trust_option()
@lock_option
@click.option("--purge-caches", is_flag=True,
              help="also remove every rank's compile caches (container.cache_dir): the next start compiles afresh")
def down(loaded, trust_new_hosts, wait_lock, purge_caches):
    """Stop and remove the serving container on every rank (fine when nothing runs)."""
    from ..apply import cluster_lock, deploy, engine_caches

    say = lambda line: err.print(line, markup=False)  # noqa: E731
    with deploy.group_for(loaded, trust_new_hosts, say) as group, cluster_lock.held(loaded, group, wait_lock, say):
        failed = deploy.down(loaded, group, say)
        if failed:
            raise SparkstackError(f"could not stop the container on {', '.join(failed)}"
                                  + ("; the compile caches were left alone" if purge_caches else ""))
        not_purged = engine_caches.purge(loaded, group) if purge_caches else []
    if not_purged:
        raise SparkstackError("stopped on every rank, but:\n" + "\n".join(not_purged))
    out.print("stopped on every rank" + (f"; compile caches under {loaded.cluster.container.cache_dir} removed"
                                         if purge_caches and loaded.cluster.container.cache_dir else ""))


@main.command()
@with_cluster()
@json_option
@trust_option()
def status(loaded, as_json, trust_new_hosts):
    """Per rank: the serving container's state and uptime, the rank's MemAvailable now, its
    image, and the API on rank 0; with a supervisor (`up --keep`), its restarts and the last
    cause it found."""
    from ..transport import api
    from ..apply import deploy, engine_caches, prep, serve

    with deploy.group_for(loaded, trust_new_hosts, lambda line: None) as group:
        states = serve.states(group)
        reached = [s.rank for s in states if s.state != "unreachable"]
        mem = prep.read_mem_available(group, reached)
        cache = engine_caches.sizes(loaded, group, reached)
    ep = api.endpoint(loaded)
    from ..apply import supervisor

    available = {r: v if isinstance(v, int) else None for r, v in mem.items()}
    data = {"ranks": [{**s.to_json(), "mem_available": available.get(s.rank),
                       "compile_cache": cache.get(s.rank) if isinstance(cache.get(s.rank), dict) else None}
                      for s in states],
            "api": {"url": ep.url, "healthy": api.health(ep)},
            "keep": supervisor.summary(supervisor.log_path(loaded))}
    if as_json:
        click.echo(json.dumps(data, indent=2))
    else:
        _print_ranks([_status_row(s, mem.get(s.rank), cache.get(s.rank)) for s in states])
        out.print(f"API {ep.url}: {'healthy' if data['api']['healthy'] else 'not answering'}")
        if data["keep"]:
            k = data["keep"]
            out.print(f"supervisor (up --keep): {k['restarts']} restart(s)"
                      + (f"; last cause at {k['last_cause_at']}: {k['last_cause']}" if k["last_cause"] else ""),
                      markup=False)
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
        "?" if isinstance(cache, str) else f"{sum(cache.values()) / 2**20:.1f} MiB" if cache else "empty")
    return (s.rank, s.host, s.describe(), shown, kept, s.image,
            f"since {s.started_at}" if s.state == "running" else "")


@main.command()
@with_cluster()
@trust_option()
@click.option("--rank", "rank", type=int, default=0, show_default=True, help="whose logs")
@click.option("-f", "--follow", is_flag=True, help="keep printing; Ctrl+C detaches, the model keeps running")
@click.option("--tail", type=click.IntRange(min=0), default=100, show_default=True, help="lines of history")
def logs(loaded, trust_new_hosts, rank, follow, tail):
    """Show a rank's serving container log."""
    from ..apply import deploy
    from ..plan.cluster_plan import CONTAINER_NAME

    if not 0 <= rank < len(loaded.cluster.ranks):  # bad input: exit 2, as click's own checks
        raise click.BadParameter(f"{rank}: the config has ranks 0..{len(loaded.cluster.ranks) - 1}",
                                 param_hint="'--rank'")
    with deploy.group_for(loaded, trust_new_hosts, lambda line: err.print(line)) as group:
        conn = group.connections[rank]
        command = f"docker logs --tail {tail} {'-f ' if follow else ''}{CONTAINER_NAME} 2>&1"
        status = conn.stream(command, lambda data: (sys.stdout.buffer.write(data), sys.stdout.flush()))
    if status not in (0, None):
        raise SparkstackError(f"{conn.target.name}: no serving container to show (docker logs exited {status})")


@main.command()
@with_cluster()
@click.option("--timeout", "wait_timeout", type=click.FloatRange(min=1), default=900, show_default=True)
@click.option("--no-progress", is_flag=True, help="only the API: no probe of the ranks, no read counters")
@trust_option()
def wait(loaded, wait_timeout, no_progress, trust_new_hosts):
    """Wait until rank 0's API answers: /health, then /v1/models, then one short completion.

    
    Meanwhile, every 10 s: the bytes each rank's engine has read of its checkpoint (the engine
    processes' read_bytes in /proc/<pid>/io, the counter vLLM's mmap loads move) against the
    bytes it will read and `check`'s cold-load estimate."""
    from ..apply import deploy, load_progress
    from ..transport import api

    ep = api.endpoint(loaded)
    say = lambda line: err.print(line, markup=False)  # noqa: E731
    if no_progress:
        seconds = api.wait_ready(ep, wait_timeout, say=say)
    else:
        with deploy.group_for(loaded, trust_new_hosts, say) as group:
            progress = load_progress.Progress(group, load_progress.estimates(loaded, group), say)
            seconds = api.wait_ready(ep, wait_timeout, say=say, watch=progress)
    out.print(f"{ep.url} serves {ep.model} ({seconds:.1f} s)")


@main.command("api-key")
@with_cluster()
@json_option
def api_key(loaded, as_json):
    """Print the key rank 0's API asks for (generated the first time).

    
    Clients send it as a bearer token, e.g.
      curl -H "Authorization: Bearer $(sparkstack api-key)" http://RANK0:PORT/v1/models
      OPENAI_BASE_URL=http://RANK0:PORT/v1 OPENAI_API_KEY=$(sparkstack api-key) your-client
    It is cluster.yaml's overrides.api_key when given; else a key generated once (by this or by
    `up`) and kept, mode 0600, in $XDG_STATE_HOME/sparkstack/api-keys/<rank 0's address>
    (default ~/.local/state/...). Delete that file and run `up` to change it.
    An API without a key (overrides.open_api: true, a TensorFold profile) is an error here
    (exit 2). --json prints {"key", "source", "file", "warning", "url"}, "key" null when none.
    """
    from ..transport import api
    from ..inputs import apikey

    key = apikey.resolve(loaded, create=True)
    url = api.endpoint(loaded).url + "/v1"
    if as_json:
        click.echo(json.dumps({**key.to_json(reveal=True), "url": url}, indent=2))
        return
    if key.value is None:
        raise apikey.ApiKeyError(f"{loaded.path}: the API at {url} takes no key: {key.warning}")
    click.echo(key.value)


PLAN_PROBE_TIMEOUT_S = 3.0  # `plan` is a look, not a preflight: it never waits long for a rank


def _probe_for_plan(loaded):
    """Facts of the ranks that answer, and the `assumed` line for those that do not (None when
    all answered). Never fails: an unreachable cluster gives the offline plan."""
    from ..transport import gather

    timeout = min(PLAN_PROBE_TIMEOUT_S, float(loaded.cluster.ssh.connect_timeout_s))
    try:
        with gather.open_group(loaded, connect_timeout=timeout) as group:
            found = gather.gather(group, loaded)
    except SparkstackError as e:  # e.g. a config the SSH layer refuses: plan offline
        return {}, f"ranks not probed ({e.message.splitlines()[0]}); `--offline` skips the attempt"
    missing = [f"rank {r} ({g.host})" for r, g in found.items() if g.facts is None]
    if not missing:
        return gather.facts_of(found), None
    return gather.facts_of(found), (
        f"ranks not probed (no answer within {timeout:.0f} s: {', '.join(missing)}): planned "
        "from the config alone; `sparkstack check` says why, `--offline` skips the attempt")


@main.command()
@with_cluster()
@json_option
@click.option("-v", "--verbose", is_flag=True, help="show every row's value, not only the problems")
@trust_option()
@click.option("--bandwidth", is_flag=True,
              help="also measure the fabric: an NCCL all-reduce in the serving image on every rank at "
                   "once (~30 s, GPU and fabric busy), bus bandwidth against the expected figure")
@click.option("--deep", is_flag=True,
              help="also hash every checkpoint file on every rank (sha256, minutes per 100 GB) against "
                   "`sparkstack manifest`'s, else the other ranks'")
def check(loaded, as_json, verbose, trust_new_hosts, bandwidth, deep):
    """Preflight every rank, read-only: one table of rank × check.

    \b
    ssh, docker, image (the profile's serving image, same ID on every rank), gpu, driver (NVIDIA
    driver and CUDA version, the same on every rank), nvidia runtime (a CDI spec of another
    driver fails; nvidia-ctk versions), gpu clock (the gpu_clock lock, applied), kernel (release
    and page size, the same on every rank), memory
    (MemAvailable vs weights + KV + runtime + headroom), vllm guard (free at start vs MemTotal ×
    --gpu-memory-utilization, as vLLM checks it), swap, sysctls, ulimits (what a
    container can get vs container.nofile/memlock), link (up, 200G), roce (RoCE v2 GID of the
    fabric IP), cx7 firmware (same on all), mtu (same on all), peers (ping every peer's fabric IP), jumbo (don't-fragment
    ping at MTU 9000), checkpoint (same path and fingerprint everywhere; the staged copy when
    model.local_path is set), staged (with model.local_path: each rank's copy has every file of
    model.path, same size and mtime; `sparkstack stage` copies what is missing), load (the interface and
    speed the checkpoint is read over, the cold-load estimate), disk, clock (≤ 1 s),
    api key (rank 0 only: the API asks for a key; warn when it takes none).
    Each row is pass / warn / fail with the measured value and, when not pass, the fix.
    --bandwidth adds a bandwidth row: 256 MiB bf16 all-reduces through torch.distributed/NCCL
    with each rank's own NCCL env; busbw (nccl-tests' definition) vs launcher/check/bandwidth.py's
    EXPECTED_BUSBW_GBPS; "not measured" (warn) when the image has no torch.
    Exit 0 when nothing fails, 1 otherwise. --json prints
    {"ok", "ranks": [{"rank", "host", "checks": [{"name", "status", "value", "fix"}]}]}.
    """
    from ..check import check as check_mod

    report = check_mod.run(loaded, trust_new=trust_new_hosts, bandwidth=bandwidth, deep=deep,  # say: a key it trusts
                           say=lambda line: err.print(line, markup=False, highlight=False))
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        _print_check(check_mod, report, verbose)
    sys.exit(0 if report.ok else 1)


@main.command()
@with_cluster()
@trust_option()
def manifest(loaded, trust_new_hosts):
    """Hash every checkpoint file once (sha256), shared out over the ranks at once, and keep the
    manifest on this host ($XDG_STATE_HOME/sparkstack/manifests/, named after the checkpoint's
    fingerprint): `check --deep` then names any rank whose shard differs from it."""
    from ..check import hashes
    from ..transport import gather

    with gather.open_group(loaded, trust_new=trust_new_hosts,
                           say=lambda line: err.print(line, markup=False, highlight=False)) as group:
        facts = gather.facts_of(gather.gather(group, loaded, model_dir=loaded.cluster.model.path))
        try:
            path, sha = hashes.make(loaded, group, facts)
        except ValueError as e:
            raise SparkstackError(str(e)) from None
    out.print(f"{len(sha)} files hashed; manifest {path}", markup=False)


@main.command()
@with_cluster(interrupted="interrupted: the files copied so far are in place and the one in flight is kept "
                          "as .NAME.partial; re-run `sparkstack stage` to resume")
@json_option
@click.option("--dry-run", is_flag=True, help="show per rank what is missing and the disk space, copy nothing")
@click.option("--from", "via", type=click.Choice(["auto", "nfs", "peer"]), default="auto", show_default=True,
              help="nfs: every rank reads model.path; peer: one rank does, the others copy from a rank "
                   "that has it over the fabric; auto: the faster by the estimate")
@click.option("--bwlimit", type=click.FloatRange(min=0, min_open=True), default=None, metavar="MB/S",
              help="cap each rank's copy at this many MB/s (keep the file server usable meanwhile)")
@trust_option()
@lock_option
def stage(loaded, as_json, dry_run, via, bwlimit, trust_new_hosts, wait_lock):
    """Copy the checkpoint from model.path to model.local_path on every rank's own disk, all
    ranks at once; `up` then serves from the local copy.

    \b
    Plan first: each rank lists both directories; a top-level file of model.path whose local
    copy has another size or mtime, or none, is copied. Nothing is copied when a rank's free
    space at model.local_path is less than what it lacks, or a rank cannot read model.path: the
    message names the rank. --from nfs: each rank reads its own model.path (the NFS mount) at
    once. --from peer: one rank reads it (a rank with a complete copy: none), the others copy
    from a rank that has the copy, over the fabric (a cable's far end in a ring), phase by phase:
    the file server's port carries the checkpoint once, not once per rank. While a phase runs,
    each source rank serves the files its readers need, unauthenticated, on its fabric address.
    --from auto (the default) takes the one with the shorter estimate (model.path's read path as
    `check`'s load row finds it, the links' speeds), nfs when either is not known. Each file goes
    to `.NAME.partial` first, is checked against `sparkstack manifest`'s sha256 when there is a
    manifest (a mismatch names the file and the rank), given the source's mtime and renamed.
    Interrupted (Ctrl+C, a lost connection), a re-run resumes each partial file from where it
    stopped: only what is missing moves. Progress per rank: copied of missing, rate, ETA.
    `check` compares every rank's copy with model.path by size and mtime; `check --deep` hashes it.
    --json prints {"plan": {"source", "dest", "manifest", "via", "estimates", "to_copy", "ranks":
    [{"rank", "host", "files": [{"name", "size", "state", "have", "mtime"}], "free", "free_at",
    "error", "extra", "peer", "peer_address", "phase", "to_copy"}]}, "ranks":
    [{"rank", "host", "copied", "missing", "seconds", "files", "error"}]} (no "ranks" with --dry-run).
    """
    from ..apply import cluster_lock
    from ..apply import stage as stage_mod
    from ..plan import staging
    from ..transport import gather

    if not loaded.cluster.model.local_path:
        raise SparkstackError("model.local_path is not set in cluster.yaml: nothing to stage to; add it "
                              "(an absolute path on each rank's own disk, the same on every rank)")
    say = lambda line: err.print(line, markup=False, highlight=False)  # noqa: E731
    with gather.open_group(loaded, trust_new=trust_new_hosts, say=say) as group:
        plan = stage_mod.make_plan(loaded, group, via)
        refusals = plan.refusals()
        if dry_run or refusals:
            if as_json:
                click.echo(json.dumps({"plan": plan.to_json()}, indent=2))
            else:
                for line in staging.lines(plan):
                    out.print(line, markup=False, highlight=False)
            if refusals:
                raise SparkstackError("nothing was copied:\n" + "\n".join(refusals))
            return
        with cluster_lock.held(loaded, group, wait_lock, say):
            results = stage_mod.apply(plan, group, say, int(bwlimit * 1e6) if bwlimit else 0)
    if as_json:
        click.echo(json.dumps({"plan": plan.to_json(), "ranks": [r.to_json() for r in results]}, indent=2))
    else:
        _print_ranks([(r.rank, r.host, _staged_text(r)) for r in results], [r.error for r in results])
    failed = [r for r in results if r.error]
    if failed:
        raise SparkstackError(f"stage failed on {', '.join(f'rank {r.rank}' for r in failed)}: see above; "
                              "fix the cause and re-run `sparkstack stage`: what is in place is kept")


def _staged_text(r) -> str:
    if not r.missing:
        return "complete, nothing to copy"
    rate = f", {r.copied / 1e6 / r.seconds:.1f} MB/s" if r.seconds and r.copied else ""
    state = "FAILED" if r.error else "staged"
    return f"{state}: {r.files} files, {r.copied / 1e6:,.1f} of {r.missing / 1e6:,.1f} MB in {r.seconds:.1f} s{rate}"


_STATUS_STYLE = {Status.PASS: "[green]pass[/]", Status.WARN: "[yellow]WARN[/]", Status.FAIL: "[bold red]FAIL[/]"}


def _print_check(check_mod, report, verbose: bool) -> None:
    table = make_table("check", *(f"{r.rank} {r.host}" for r in report.ranks))
    cells = {(r.rank, c.name): c.status for r in report.ranks for c in r.checks}
    for name in check_mod.SHOWN:
        if any((r.rank, name) in cells for r in report.ranks):
            table.add_row(name, *(_STATUS_STYLE.get(cells.get((r.rank, name)), "[dim]-[/]")
                                  for r in report.ranks))
    print_table(table)
    for r in report.ranks:
        for c in r.checks:
            if verbose or c.status != Status.PASS:
                out.print(f"{_STATUS_STYLE[c.status]} rank {r.rank} {r.host} [bold]{c.name}[/]: ",
                          end="")
                out.print(c.value, markup=False)
                if c.fix:
                    out.print(f"     fix: {c.fix}", markup=False)
    verdict = "[green]ok[/]" if report.ok else "[bold red]not ready[/]"
    out.print(f"{verdict} ({report.seconds:.2f} s)")


@main.command()
@with_cluster()
@json_option
@click.option("--no-drop", is_flag=True, help="set sysctls and mounts only; keep the page cache")
@click.option("--wait-timeout", type=click.FloatRange(min=1), default=120, show_default=True,
              help="seconds to wait for MemAvailable to come back after dropping caches")
@trust_option()
@lock_option
def prep(loaded, as_json, no_drop, wait_timeout, trust_new_hosts, wait_lock):
    """Prepare every rank for serving after a boot (idempotent, all ranks in parallel).

    \b
    Sets the sysctls of launcher/inputs/node_settings.py (vm.swappiness=1,
    vm.compaction_proactiveness=0, plus overrides), turns swap off when the profile or
    overrides.no_swap says no swap (swapoff -a; swap lines of /etc/fstab commented out, so it
    stays off after a reboot), mounts the checkpoint's NFS export at
    model.path when the config names one and it is not mounted (the NFS server's own node
    bind-mounts its export there), drops page caches and waits until every rank's MemAvailable
    covers what the plan needs. Reports per rank what changed and what was already set.
    Needs root or sudo on the ranks (the cache drop alone works through the narrow sudoers
    rule). --json prints {"ok", "mem_needed", "seconds", "ranks": [{"rank", "host",
    "changed", "already", "failed", "mem_available", "error"}]}.
    """
    from ..apply import cluster_lock
    from ..apply import prep as prep_mod

    from ..transport import gather

    say = lambda line: err.print(line, markup=False, highlight=False)  # noqa: E731
    with gather.open_group(loaded, trust_new=trust_new_hosts, say=say) as group, \
            cluster_lock.held(loaded, group, wait_lock, say):
        report = prep_mod.prepare(loaded, group, drop=not no_drop, wait_timeout=wait_timeout, say=say)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        _print_prep(report)
    if not report.ok:
        bad = [f"rank {r.rank}" for r in report.ranks if r.error or r.failed]
        raise SparkstackError(f"prep failed on {', '.join(bad)}: see the lines above; fix and re-run "
                              "`sparkstack prep` (what is already set is left alone)")


def _print_prep(report) -> None:
    rows = make_table("rank", "changed", "already set", "FAILED", "MemAvailable")
    for r in report.ranks:
        mem = "" if r.mem_available is None else f"{r.mem_available / 2**30:.1f} GiB"
        rows.add_row(*map(plain, (f"{r.rank} {r.host}", ", ".join(r.changed), ", ".join(r.already),
                                  ", ".join(r.failed), mem)))
    print_table(rows)
    _print_errors([r.error for r in report.ranks])


def _print_ranks(rows, errors=()) -> None:
    """A per-rank table without a header, its first column `rank R HOST` (what the other cells
    are needs no naming), then each rank's error."""
    table = make_table()
    for rank, host, *cells in rows:
        table.add_row(plain(f"rank {rank} {host}"), *map(plain, cells))
    print_table(table)
    _print_errors(errors)


def _print_errors(errors) -> None:
    """Each rank's error under its table (its text names the rank)."""
    for error in filter(None, errors):
        out.print("  [bold red]error:[/] ", end="")
        out.print(error, markup=False)


@main.command("systemd-unit")
@with_cluster()
@click.option("--user", default=None, help="who runs it (default: you)")
@click.option("--timeout", type=click.IntRange(min=1), default=1800, show_default=True,
              help="seconds `up` waits for the API")
@click.option("--keep", is_flag=True, help="run `up --keep`: supervise the cluster and re-deploy it after a failure")
def systemd_unit(loaded, user, timeout, keep):
    """Print a systemd unit that runs `sparkstack up` on this control host after every boot
    (with --keep, `up --keep`, so a crash also ends in a serving cluster)."""
    import getpass
    import pathlib

    from ..plan import systemd_unit

    path = loaded.path.resolve()
    click.echo(systemd_unit.render(profile=loaded.profile.name, ranks=len(loaded.cluster.ranks),
                                   user=user or getpass.getuser(), workdir=path.parent, config=path,
                                   sparkstack=pathlib.Path(sys.executable).parent / "sparkstack",  # beside its python
                                   timeout=timeout, keep=keep), nl=False)


from .sandbox import sandbox  # noqa: E402  (its own group: sparkstack sandbox up|down|status)

main.add_command(sandbox)

from .init import init  # noqa: E402  (sparkstack init HOST...)

main.add_command(init)
