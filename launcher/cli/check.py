"""`sparkstack check`: every rank preflighted, read-only, and the table of rank x check
(print_check: `init` prints it too)."""

from __future__ import annotations

import json
import sys

import click

from ..status import Status
from .console import err, make_table, out, print_table
from .shared import json_option, trust_option, with_cluster


@click.command()
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
    from ..gather import cluster, probe

    say = lambda line: err.print(line, markup=False, highlight=False)  # noqa: E731 -- a key it trusts
    begun = cluster.Begun(loaded, probe.open_group(loaded, trust_new=trust_new_hosts, say=say))
    from ..apply import preflight  # and the rows: imported while the ranks are probed

    report = preflight.run(loaded, bandwidth=bandwidth, deep=deep, begun=begun)
    if as_json:
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        print_check(report, verbose)
    sys.exit(0 if report.ok else 1)


_STATUS_STYLE = {Status.PASS: "[green]pass[/]", Status.WARN: "[yellow]WARN[/]", Status.FAIL: "[bold red]FAIL[/]"}


def print_check(report, verbose: bool) -> None:
    """The table of rank × row, then the verdicts shown (every one with -v, else those not
    pass): one every rank shares (same row, status, value and fix) once, its ranks named
    ("ranks 0–3"), then each rank's own, rank by rank; then ok or not ready."""
    from ..check.report import SHOWN

    table = make_table("check", *(f"{r.rank} {r.host}" for r in report.ranks))
    cells = {(r.rank, c.name): c.status for r in report.ranks for c in r.checks}
    for name in SHOWN:
        if any((r.rank, name) in cells for r in report.ranks):
            table.add_row(name, *(_STATUS_STYLE.get(cells.get((r.rank, name)), "[dim]-[/]")
                                  for r in report.ranks))
    print_table(table)
    shared = shared_verdicts(report)
    everyone = ranks_named([r.rank for r in report.ranks])
    for c in shared.values():
        if verbose or c.status != Status.PASS:
            _print_verdict(c, everyone)
    for r in report.ranks:
        for c in r.checks:
            if c.name not in shared and (verbose or c.status != Status.PASS):
                _print_verdict(c, f"rank {r.rank} {r.host}")
    verdict = "[green]ok[/]" if report.ok else "[bold red]not ready[/]"
    out.print(f"{verdict} ({report.seconds:.2f} s)")


def _print_verdict(c, who: str) -> None:
    out.print(f"{_STATUS_STYLE[c.status]} {who} [bold]{c.name}[/]: ", end="")
    out.print(c.value, markup=False)
    if c.fix:
        out.print(f"     fix: {c.fix}", markup=False)


def _verdict(row) -> tuple:
    return row.name, row.status, row.value, row.fix


def shared_verdicts(report) -> dict:
    """Row name -> the row, for each row every rank of a report of two ranks or more has once,
    with the same status, value and fix; in the first rank's order."""
    if len(report.ranks) < 2:
        return {}
    per_rank = []
    for r in report.ranks:
        names = [c.name for c in r.checks]
        per_rank.append({c.name: _verdict(c) for c in r.checks if names.count(c.name) == 1})
    first = report.ranks[0]
    return {c.name: c for c in first.checks
            if all(rows.get(c.name) == _verdict(c) for rows in per_rank)}


def ranks_named(ranks: list[int]) -> str:
    """`ranks 0–3` for a run of three or more, else `ranks 0, 2`."""
    ranks = sorted(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}–{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))
