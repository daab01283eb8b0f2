"""`sparkstack verify` and `up`'s quick form: what the served model says, read through its API and
judged by launcher/check/verify.py (the thresholds and why are there).

- perplexity: the held-out texts shipped with the kit (data/heldout/, CC0, written for the kit),
  each cut into chunks that fit the context at line breaks, scored with the engine's prompt
  logprobs (teacher forcing); the quick form reads the first QUICK_CHARS of each, the full form all;
- probes: greedy completions with one right answer, alone and at 4- and 8-way concurrency (the
  full form repeats each round FULL_ROUNDS times: a fault under batching need not show every time);
- the baseline for this checkpoint + recipe, kept on this host beside the kit's other state
  (`verify --record-baseline` writes it; `run` reads it).

`run(loaded, quick=True) -> VerifyResult` is the one entry point; `quick(loaded)` is the form
`up`, `upgrade`, `rollback` and the supervisor pass to deploy.up's `verify` seam, and
`chosen(no_verify)` picks it or the skip.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import httpx

from ..check import verify as judging
from ..check.verify import Baseline, Measured, ProbeAnswer, TextFigure, VerifyResult
from ..errors import SparkstackError
from ..inputs import apikey
from ..inputs.config import Loaded, cluster_name
from ..transport import api

HELDOUT_DIR = Path(__file__).resolve().parent / "data" / "heldout"
TEXTS = ("prose", "code")  # data/heldout/<name>.txt
QUICK_CHARS = 2048  # the quick form's share of each text: a second of prefill on four Sparks
FULL_CHARS = 4096  # the full form's chunk, at most (and never more than the context)
FULL_ROUNDS = 3


@dataclass(frozen=True)
class HeldOut:
    name: str
    text: str
    sha256: str


def held_out() -> tuple[HeldOut, ...]:
    texts = []
    for name in TEXTS:
        data = (HELDOUT_DIR / f"{name}.txt").read_bytes()
        texts.append(HeldOut(name, data.decode("utf-8"), hashlib.sha256(data).hexdigest()))
    return tuple(texts)


def run(loaded: Loaded, quick: bool = True, say=lambda line: None) -> VerifyResult:
    """Measure through rank 0's API and judge against this recipe's baseline (if recorded)."""
    ep = api.endpoint(loaded)
    started = time.monotonic()
    try:
        measured = measure(ep, quick, say)
    except httpx.HTTPError as e:
        raise SparkstackError(f"verify: rank 0's API at {ep.url} did not answer ({type(e).__name__}: {e}); "
                              "is it serving? `sparkstack status` says, `sparkstack up` starts it") from None
    measured = Measured(measured.form, measured.figures, measured.answers, time.monotonic() - started,
                        measured.no_logprobs)
    return judging.judge(measured, read_baseline(loaded), loaded.engine.prompt_logprobs)


def quick(loaded: Loaded) -> VerifyResult:
    """The quick form, as deploy.up's `verify` callable: a failed result stops every rank there."""
    return run(loaded, quick=True)


def chosen(no_verify: bool):
    """deploy.up's `verify` for a command's --no-verify: the quick form, or False (skipped on
    purpose, recorded as that in the history)."""
    return False if no_verify else quick


def measure(ep: api.Endpoint, quick: bool, say=lambda line: None) -> Measured:
    figures, missing = perplexities(ep, quick, say)
    answers = []
    for n in judging.CONCURRENCY:
        for _ in range(1 if quick else FULL_ROUNDS):
            answers += _probe_round(ep, n)
    return Measured("quick" if quick else "full", tuple(figures), tuple(answers), 0.0, missing)


def perplexities(ep: api.Endpoint, quick: bool, say=lambda line: None) -> tuple[list[TextFigure], str | None]:
    """Each held-out text's perplexity (the quick form: its start), and why there is none when
    the server gives no prompt logprobs."""
    context = api.context_length(ep)
    figures: list[TextFigure] = []
    for text in held_out():
        try:
            figures.append(_perplexity(ep, text, context, quick))
        except api.ApiRefused as e:
            if e.status != 200:  # the server refused the request itself: not a missing feature
                raise SparkstackError(f"verify: {e.message}") from None
            return [], (f"the server at {ep.url} gave no prompt logprobs ({e.message}): the perplexity "
                        "of the held-out texts cannot be read there; the probes are all verify checks")
        say(f"  perplexity {text.name}: {figures[-1].perplexity:.3f} over {figures[-1].tokens} tokens")
    return figures, None


def _perplexity(ep: api.Endpoint, text: HeldOut, context: int | None, quick: bool) -> TextFigure:
    body = text.text[:QUICK_CHARS] if quick else text.text
    size = min(QUICK_CHARS if quick else FULL_CHARS, (context or FULL_CHARS) - 8)
    for _attempt in range(4):
        try:
            return _score(ep, text, chunked(body, size), len(body))
        except api.ApiRefused as e:
            if e.status != 400 or size < 256:
                raise
            size //= 2  # the server's tokens are longer than a character's worth here: smaller chunks
    raise AssertionError("unreachable")


def _score(ep: api.Endpoint, text: HeldOut, chunks: list[str], chars: int) -> TextFigure:
    nll, scored = 0.0, 0
    for chunk in chunks:
        logprobs = api.prompt_logprobs(ep, chunk)
        values = [t.logprob for t in logprobs.tokens if t.logprob is not None]
        nll -= sum(values)
        scored += len(values)
    return TextFigure(text.name, text.sha256, scored, len(chunks), math.exp(nll / max(scored, 1)), chars)


def chunked(text: str, size: int) -> list[str]:
    """`text` in pieces of at most `size` characters, cut after a line break where one is near."""
    pieces, rest = [], text
    while rest:
        if len(rest) <= size:
            pieces.append(rest)
            break
        cut = rest.rfind("\n", size // 2, size)
        cut = size if cut < 0 else cut + 1
        pieces.append(rest[:cut])
        rest = rest[cut:]
    return pieces


def _probe_round(ep: api.Endpoint, n: int) -> list[ProbeAnswer]:
    """n probes sent at once (the list cycled), so that the engine batches them."""
    probes = [judging.PROBES[i % len(judging.PROBES)] for i in range(n)]
    together = threading.Barrier(n)  # each thread leaves only once all n are ready: one batch

    def ask(p):
        together.wait(timeout=30)
        return api.greedy(ep, p.prompt, p.max_tokens)

    with ThreadPoolExecutor(max_workers=n) as pool:
        replies = list(pool.map(ask, probes))
    return [ProbeAnswer(p.name, n, p.expected, got, judging.answered(p, got)) for p, got in zip(probes, replies)]


# ---------------------------------------------------------------- the baseline

def recipe(loaded: Loaded) -> dict:
    """What a baseline belongs to: the checkpoint (its config.json and index, hashed, when this
    host reads them; else its path), the profile, the serving image and the engine's own args."""
    from ..images import build

    model = loaded.cluster.model
    digest = hashlib.sha256()
    found = False
    for name in ("config.json", "model.safetensors.index.json"):
        path = Path(model.path) / name
        if path.is_file():
            digest.update(path.read_bytes())
            found = True
    return {"cluster": cluster_name(loaded), "profile": loaded.profile.name,
            "image": build.serving_image(loaded)[0],
            "checkpoint": digest.hexdigest()[:16] if found else model.path,
            "args": list(loaded.profile.args) + list(loaded.cluster.overrides.engine_args)}


def baseline_path(loaded: Loaded, the_recipe: dict | None = None) -> Path:
    the_recipe = the_recipe or recipe(loaded)
    key = hashlib.sha256(json.dumps(the_recipe, sort_keys=True).encode()).hexdigest()[:16]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", the_recipe["cluster"])
    return apikey.state_dir() / "baselines" / name / f"{the_recipe['profile']}-{key}.json"


def read_baseline(loaded: Loaded) -> Baseline | None:
    path = baseline_path(loaded)
    if not path.is_file():
        return None
    try:
        return Baseline.from_json(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as e:
        raise SparkstackError(f"verify: the baseline {path} does not read ({e}); remove it and record "
                              "it again on a deploy you trust: sparkstack verify --full --record-baseline") from None


def record_baseline(loaded: Loaded, result: VerifyResult) -> Path:
    """Keep `result`'s figures, and the other form's (read now), as this recipe's baseline: `up`'s
    quick form and `verify --full` each compare with their own. Only a result whose probes all
    passed and whose perplexity is sane: a baseline of a broken deploy would pass the next one."""
    if not result.measured.figures:
        raise SparkstackError("verify: no perplexity was read (the server gave no prompt logprobs): "
                              "there is nothing to record as a baseline")
    wrong = [a for a in result.measured.answers if not a.ok]
    wild = [f for f in result.measured.figures if f.perplexity > judging.SANE_PERPLEXITY]
    if wild:
        raise SparkstackError(f"verify: perplexity {wild[0].name} {wild[0].perplexity:.1f} is above the sane "
                              f"bound {judging.SANE_PERPLEXITY:g}: this deploy emits gibberish; nothing recorded")
    if wrong:
        raise SparkstackError(f"verify: {len(wrong)} probe(s) answered wrong: this deploy is not one to "
                              "trust; nothing recorded. Fix it, then record the baseline again")
    other, _missing = perplexities(api.endpoint(loaded), quick=result.form == "full")
    figures = (*result.measured.figures, *other)
    the_recipe = recipe(loaded)
    path = baseline_path(loaded, the_recipe)
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(Baseline(the_recipe, figures, stamp).to_json(), indent=2) + "\n")
    tmp.replace(path)
    return path
