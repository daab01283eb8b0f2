"""What `sparkstack bench` hands back: a table like the seeds', a JSON file and a PNG plot.

The table mirrors seed 000's: a row per task with tok/s at each concurrency (aggregate; at C1
that is the one stream), the TTFT range and accepted tokens/step, and under it the per-stream
medians.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich import box
from rich.table import Table

from ..status import Status
from .results import Results, size_label


def _num(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def tok_s_table(results: Results) -> Table:
    """A row per task with the aggregate tok/s at each concurrency (at C1, the one stream), then
    a dim row with the per-stream median: narrow enough for 80 columns at C1/C2/C4/C8."""
    s = results.settings
    table = Table(title=f"{results.model or results.target.model} at {results.target.url}",
                  title_justify="left", caption_justify="left", box=box.SIMPLE_HEAD,
                  caption=f"decode tok/s = completion tokens ÷ (wall − TTFT), summed across "
                          f"streams; /stream = the median stream. max_tokens {s.max_tokens}, "
                          f"temperature {s.temperature}, top_p {s.top_p}, "
                          f"thinking {'on' if s.thinking else 'off'}.")
    table.add_column("tok/s", style="bold", no_wrap=True)
    for c in s.concurrency:
        table.add_column(f"C{c}", justify="right", no_wrap=True)
    table.add_column("TTFT s", justify="right", no_wrap=True)
    table.add_column("accepted/step", justify="right", no_wrap=True)
    for task in dict.fromkeys(c.task for c in results.cells):
        cells = {c.concurrency: c for c in results.cells if c.task == task}
        found = [cells.get(c) for c in s.concurrency]
        median, p90 = _ttft(list(cells.values()))
        table.add_row(task, *(_num(c and c.aggregate_tok_s) for c in found), median,
                      _num(results.task_accepted_per_step(task), 2))
        table.add_row("  /stream", *(_num(c and c.per_stream_tok_s) for c in found), p90, "",
                      style="dim")
    return table


def _ttft(cells) -> tuple[str, str]:
    """The range of the cells' median TTFTs, as the seeds quote it, and the worst p90."""
    medians = [m for m in (c.ttft(50) for c in cells) if m is not None]
    p90s = [p for p in (c.ttft(90) for c in cells) if p is not None]
    if not medians:
        return "–", ""
    low, high = f"{min(medians):.2f}", f"{max(medians):.2f}"
    return (low if low == high else f"{low}–{high}"), f"p90 {max(p90s):.2f}"


def needle_table(results: Results) -> Table:
    table = Table(title="needle", title_justify="left", box=box.SIMPLE_HEAD)
    for name in ("depth", "prompt tokens", "fact at", "TTFT s", "prefill tok/s", "decode tok/s",
                 "result"):
        table.add_column(name, justify="left" if name in ("depth", "result") else "right")
    for n in results.needles:
        r = n.request
        estimated = "" if r.tokens_from == "usage" else " (est.)"
        table.add_row(size_label(n.tokens), f"{r.prompt_tokens:,}{estimated}",
                      f"{n.position:.0%}", _num(r.ttft_s, 2), _num(n.prefill_tok_s),
                      _num(r.decode_tok_s), "[green]PASS[/]" if n.passed else "[red]FAIL[/]")
    return table


def stem(results: Results) -> str:
    started = time.strptime(results.started_at, "%Y-%m-%dT%H:%M:%SZ")
    return "sparkstack-bench-" + time.strftime("%Y%m%d-%H%M%S", started)


def write_json(results: Results, out_dir: Path) -> Path:
    path = out_dir / f"{stem(results)}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(results.to_json(), indent=2) + "\n")
    tmp.replace(path)  # a reader never sees half a file
    return path


def write_png(results: Results, out_dir: Path) -> Path | None:
    """tok/s against concurrency, a line per task: aggregate solid, per-stream median dashed.
    None when no cell was measured."""
    if not results.cells:
        return None
    # The object API with its own Agg canvas: no pyplot, no global backend, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, task in enumerate(dict.fromkeys(c.task for c in results.cells)):
        cells = sorted((c for c in results.cells if c.task == task), key=lambda c: c.concurrency)
        xs = [c.concurrency for c in cells]
        color = f"C{i}"
        ax.plot(xs, [c.aggregate_tok_s for c in cells], marker="o", color=color,
                label=f"{task} aggregate")
        ax.plot(xs, [c.per_stream_tok_s for c in cells], marker=".", linestyle="--",
                color=color, alpha=0.7, label=f"{task} per stream")
    levels = sorted(results.settings.concurrency)
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("decode tok/s")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", ncols=2)
    ax.set_title(f"{results.model or results.target.model} · {results.started_at}"
                 + ("" if results.status == Status.COMPLETE else f" · {results.status}"), fontsize=10)
    fig.tight_layout()
    path = out_dir / f"{stem(results)}.png"
    fig.savefig(path, format="png")
    return path


def write_files(results: Results, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [write_json(results, out_dir)]
    png = write_png(results, out_dir)
    return paths + ([png] if png else [])
