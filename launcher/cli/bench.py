"""`sparkstack bench`: decode tok/s, TTFT and speculative acceptance against the served API."""

from __future__ import annotations

import json
import sys

import click

from ..inputs import config as config_mod
from ..status import Status
from .console import err, friendly_errors, out
from .shared import config_option, json_option


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


@click.command()
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
    results = _measure_with_progress(target, settings)
    paths = bench_report.write_files(results, pathlib.Path(out_dir)) if results.started else []
    if as_json:
        click.echo(json.dumps(results.to_json(), indent=2))
    else:
        _print_bench(results)
    for path in paths:
        err.print(f"wrote {path}")
    if results.status == Status.FAILED:
        raise bench_mod.BenchError(results.error)
    if results.status == Status.INTERRUPTED:
        sys.exit(130)


def _print_bench(results) -> None:
    from ..bench import report as bench_report

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


def _measure_with_progress(target, settings):
    from ..bench import run as bench_mod
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description:<14}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("requests"), TimeElapsedColumn())
    # Off when stderr is not a terminal: a log file gets the results, not a redrawn bar.
    with Progress(*columns, console=err.console, transient=True, disable=not err.is_terminal) as progress:
        bar = progress.add_task(f"connecting to {target.url}", total=settings.total_requests)
        return bench_mod.measure(
            target, settings, lambda what, n: progress.update(bar, description=what, advance=n))
