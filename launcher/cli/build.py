"""`sparkstack build`: the profile's image chain, on the local Docker or on every rank's."""

from __future__ import annotations

import json

import click

from ..status import Status
from .console import err, make_table, out, plain, print_table
from .shared import json_option, print_ranks, trust_option, with_cluster


@click.command()
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
    from ..images import chain as images_mod
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
        return _build_on_ranks(loaded, chain, as_json, trust_new_hosts)
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


def _build_on_ranks(loaded, chain, as_json: bool, trust_new_hosts: bool) -> None:
    from ..images import build as build_mod
    from ..transport import remote

    with remote.Group.for_cluster(loaded.cluster, trust_new=trust_new_hosts, say=err.print) as group:
        ranks = build_mod.build_on_ranks(loaded, chain, say=lambda line: err.print(line, markup=False),
                                         group=group)
    if as_json:
        click.echo(json.dumps({"ranks": [r.to_json() for r in ranks]}, indent=2))
    else:
        print_ranks([(r.rank, r.host, r.status, f"{sum(s['built'] for s in r.stages)} of "
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
                                     TimeElapsedColumn(), console=err.console, transient=True,
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
