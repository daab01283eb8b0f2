"""`sparkstack verify`: is the served model right? Perplexity on the kit's held-out texts from the
engine's prompt logprobs, and greedy probes alone and crowded, against this recipe's baseline."""

from __future__ import annotations

import json

import click

from .console import err, out
from .shared import json_option, with_cluster


@click.command()
@with_cluster()
@json_option
@click.option("--full", is_flag=True, help="every chunk of every held-out text and three rounds of "
              "probes at each concurrency (minutes on a real cluster); default: the quick form (seconds)")
@click.option("--record-baseline", is_flag=True,
              help="keep this run's figures as the baseline of this checkpoint + recipe (only on a deploy "
                   "you trust; refused when a probe is wrong or the perplexity is beyond the sane bound)")
def verify(loaded, as_json, full, record_baseline):
    """Check what the cluster serves, through its API: the teacher-forced perplexity of the
    held-out prose and code shipped with the kit (read from the engine's prompt logprobs, in
    chunks that fit the context) and greedy probes with known answers (counting, arithmetic, a
    fact, a short code task) alone and 4 and 8 at once (a TP kernel can be wrong only when
    requests batch).

    \b
    With a baseline (recorded with --record-baseline on a deploy you trust, kept on this host
    per checkpoint + recipe) each perplexity must stay within 2 % of it; without one, below the
    sane bound 100 (gibberish is far above). The probes must all answer right. The model cards'
    own perplexities are shown beside, as context, never as thresholds. A vLLM server without
    prompt logprobs is refused; on TensorFold, whose server may not give them, the probes alone
    are judged, and it says so. `up` runs the quick form once the API answers (--no-verify skips).
    Exit status 1 when the model fails."""
    from ..apply import verify as verifying
    from ..errors import SparkstackError

    say = (lambda line: None) if as_json else (lambda line: err.print(line, markup=False))  # noqa: E731
    result = verifying.run(loaded, quick=not full, say=say)
    recorded = None
    if record_baseline:
        recorded = verifying.record_baseline(loaded, result)
    if as_json:
        click.echo(json.dumps({**result.to_json(), "baseline_recorded": str(recorded) if recorded else None},
                              indent=2))
    else:
        print_result(result)
        if recorded:
            out.print(f"baseline recorded: {recorded}", markup=False)
    if not result.ok and not recorded:
        raise SparkstackError(f"the served model failed verification -- fix: {result.fix}")


def print_result(result) -> None:
    for line in result.lines:
        mark = "[green]ok[/]  " if line.ok else "[red]FAIL[/]"
        out.print(f"{mark} {line.what}: {line.measured}   ({line.bound})")
    for f in result.measured.figures:
        out.print(f"     {f.name}: {f.tokens} tokens in {f.chunks} chunk(s), text sha256 {f.sha256[:16]}",
                  markup=False)
    for card, figures in result.context:
        out.print(f"     context, not a threshold (other texts): {card}: {figures}", markup=False)
    for note in result.notes:
        out.print(f"     note: {note}", markup=False)
    out.print(result.summary(), markup=False)
