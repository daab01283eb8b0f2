"""`sparkstack top`: the cluster live in the terminal, from the samples `metrics serve` exports."""

from __future__ import annotations

import json
import os
import select
import sys
import termios
import time
import tty
from contextlib import contextmanager

import click

from .console import make_table, out, plain, print_table
from .shared import json_option, trust_option, with_cluster

BAR = 20
GIB = 1024 ** 3


@click.command()
@with_cluster(interrupted="stopped")
@click.option("--interval", type=click.FloatRange(min=0.2, max=60), default=1.0, show_default=True,
              metavar="SECONDS", help="how often each rank reports and the view refreshes")
@click.option("--once", is_flag=True, help="print one view and exit (after two samples, so rates exist)")
@json_option
@trust_option()
def top(loaded, interval, once, as_json, trust_new_hosts):
    """Live view of every rank: MemAvailable as a bar with the planned floor, GPU (utilization, SM
    clock, power, temperature; "not measured" without nvidia-smi), RoCE rates in and out, the
    engine container and the memory guard's events; and the cluster: tokens/s, running and
    waiting requests, KV cache use, accepted tokens per step. One SSH channel per rank; `q` or
    Ctrl+C quits. `--once --json` prints one view for scripts."""
    from ..apply import deploy
    from ..apply.top import Top

    with deploy.group_for(loaded, trust_new_hosts, lambda line: None) as group, Top(loaded, group, interval) as t:
        t.sampling.wait_for_samples(max(15.0, 5 * interval))
        if once or as_json:
            t.read()  # the first engine reading: tokens/s and acceptance need two
            _sleep(2 * interval)
            shown = t.read()
            if as_json:
                click.echo(json.dumps(shown, indent=2))
            else:
                table, *lines = _render(shown).renderables
                print_table(table)  # a pipe or a log gets one line per rank
                for line in lines:
                    out.print(line)
            return
        _live(t, interval)


def _sleep(seconds: float) -> None:
    select.select([], [], [], seconds)


@contextmanager
def _keys():
    """The terminal in cbreak mode (a key arrives without Enter, Ctrl+C still interrupts), put
    back however the view ends; no terminal: no keys."""
    fd = sys.stdin.fileno() if sys.stdin.isatty() else None
    saved = termios.tcgetattr(fd) if fd is not None else None
    try:
        if fd is not None:
            tty.setcbreak(fd)
        yield fd
    finally:
        if saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _live(t, interval: float) -> None:
    from rich.live import Live

    with _keys() as fd, Live(_render(t.read()), console=out.console, auto_refresh=False, screen=True) as live:
        try:
            while True:
                ready = select.select([fd] if fd is not None else [], [], [], interval)[0]
                if ready and os.read(fd, 32).lower().startswith(b"q"):
                    return
                live.update(_render(t.read()), refresh=True)
        except KeyboardInterrupt:
            return


def _bar(m: dict, floor: int) -> str:
    """MemAvailable of MemTotal as a bar, the floor marked `|`."""
    cells = round(BAR * m["available_bytes"] / m["total_bytes"])
    mark = min(BAR - 1, round(BAR * floor / m["total_bytes"]))
    bar = ["#" if i < cells else "." for i in range(BAR)]
    bar[mark] = "|"
    return "[" + "".join(bar) + f"] {m['available_bytes'] / GIB:.1f}/{m['total_bytes'] / GIB:.1f} GiB"


def _gpu(g: dict) -> str:
    if g["not_measured"]:
        return "GPU not measured"
    parts = [f"{g['utilization_pct']:.0f}%" if g["utilization_pct"] is not None else "?%",
             f"{g['sm_clock_mhz']:.0f} MHz" if g["sm_clock_mhz"] is not None else "",
             f"{g['power_w']:.0f} W" if g["power_w"] is not None else "",
             f"{g['temperature_c']:.0f} C" if g["temperature_c"] is not None else ""]
    return "GPU " + " ".join(p for p in parts if p)


def _rate(bytes_s: float) -> str:
    return f"{bytes_s / 1e6:.1f} MB/s"


def _render(view: dict):
    from rich.console import Group

    table = make_table("rank", "host", "MemAvailable (| floor)", "GPU", "fabric out/in", "engine", "guard")
    for r in view["ranks"]:
        if not r["sampled"]:
            table.add_row(str(r["rank"]), plain(r["host"]), plain(f"no sample ({r['error'] or 'waiting'})"), "", "", "", "")
            continue
        f = r["fabric"]
        errors = f" errors: {', '.join(f'{k} +{n}' for k, n in f['errors'].items())}" if f["errors"] else ""
        table.add_row(str(r["rank"]), plain(r["host"]),
                      plain(_bar(r["memory"], r["floor_bytes"]) if r["memory"] else "meminfo unreadable")
                      + (" BELOW FLOOR" if r["memory"] and r["memory"]["below_floor"] else ""),
                      plain(_gpu(r["gpu"])), plain(f"{_rate(f['transmit_bytes_s'])} / {_rate(f['receive_bytes_s'])}{errors}"),
                      plain(r["engine"]["state"] + (f" {r['engine']['memory_bytes'] / GIB:.1f} GiB"
                                                    if r["engine"]["memory_bytes"] else "")),
                      plain(", ".join(f"{k} {v}" for k, v in sorted(r["guard_events"].items())) or "-"))
    e = view["engine"]

    def num(value, fmt):
        return "-" if value is None else fmt.format(value)

    cluster = (f"cluster {view['cluster']}: " + (
        f"{num(e['tokens_per_s'], '{:.1f}')} tokens/s, {num(e['running'], '{:.0f}')} running, "
        f"{num(e['waiting'], '{:.0f}')} waiting, KV {num(e['kv_cache_usage'], '{:.0%}')}, "
        f"{num(e['accepted_per_step'], '{:.2f}')} accepted/step" if e["engine_metrics"] == "ok"
        else f"engine metrics: {e['engine_metrics']}"))
    at = view["sampled_at"]
    stamp = time.strftime("%H:%M:%S", time.localtime(at)) + f".{int(at * 10) % 10}" if at else "-"
    return Group(table, plain(cluster), plain(f"sampled at {stamp} (the ranks' clock); q or Ctrl+C quits"))
