"""Judging what the served model says (`sparkstack verify`, and `up`'s quick form): pure, from the
figures apply/verify.py measured through the API.

Two kinds of evidence (issue 30, seed 003's "check with a teacher-forced perplexity read"):
- perplexity: the engine's own prompt logprobs over held-out texts shipped with the kit
  (launcher/apply/data/heldout/, content-hashed). A runtime that narrows a shard loads without
  error and then scores real text like noise;
- probes: greedy completions with one right answer (counting, arithmetic, a fact, a short code
  task), alone and at 4- and 8-way concurrency: a TP kernel that is wrong only when requests
  batch (seed 003's correctness probe) passes alone and fails crowded.

Thresholds:
- with a baseline (recorded on a deploy the owner trusts, for this checkpoint + recipe): each
  text's perplexity within BASELINE_TOLERANCE of the baseline's. The same weights through the same
  kernels move perplexity by well under 1 % (seed 003: 4.82-4.84 across its fleet; seed 001: 3.560
  vs 3.567 when the 5-bit layers became FP8), and a broken overlay moves it by orders of magnitude,
  so 2 % flags a real change without flagging batch-order jitter;
- without one: below SANE_PERPLEXITY. Any language model that reads English prose and Python is
  far below it (GLM-5.3: 3-5 per token on the cards; the sandbox's byte-level stand-in: 30-50), and
  noise is far above it (uniform guessing over the vocabulary: its size, 154,880 for GLM-5.3, ~600
  for the stand-in's noise). It catches gibberish, not a subtle regression: that needs a baseline.
The cards' own figures (CARD_FIGURES) are shown beside as context, never as a threshold: their
texts are not ours.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BASELINE_TOLERANCE = 0.02  # relative, per text (module docstring)
SANE_PERPLEXITY = 100.0  # absolute, per token, when there is no baseline (module docstring)
CONCURRENCY = (1, 4, 8)  # alone, then 4- and 8-way at once (seed 003's probe)
CARD_FIGURES = (
    ("seed 001 (keys35, 2.75 bpw)", "prose 3.560 (12,223 tokens), code 2.913 (3,882 tokens)"),
    ("seed 003 (Pollard, 3.2 bpw)", "4.831 over 6 held-out texts, 4,079 tokens"),
)


@dataclass(frozen=True)
class Probe:
    """A greedy completion with one right answer: `expected` must lead the reply (spaces aside)."""

    name: str
    prompt: str
    expected: str
    max_tokens: int = 8


PROBES = (
    Probe("counting", "Count on: 1, 2, 3, 4, 5, 6,", "7"),
    Probe("arithmetic", "Q: What is 17 + 25?\nA:", "42"),
    Probe("fact", "Q: What is the capital of France?\nA: The capital of France is", "Paris"),
    Probe("code", "def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n    return", "a + b"),
)


def answered(probe: Probe, text: str) -> bool:
    return text.strip().startswith(probe.expected)


@dataclass(frozen=True)
class TextFigure:
    """One held-out text's perplexity as the engine scored it."""

    name: str
    sha256: str  # of the text's bytes: a figure belongs to exactly this text
    tokens: int  # scored tokens (each chunk's first is not scored)
    chunks: int
    perplexity: float
    chars: int = 0  # how much of the text was read (the quick form reads its start)

    @property
    def key(self) -> tuple[str, int]:
        """What a baseline figure must share to be compared: the same bytes, read as far."""
        return self.sha256, self.chars

    def to_json(self) -> dict:
        return {"name": self.name, "sha256": self.sha256, "chars": self.chars, "tokens": self.tokens,
                "chunks": self.chunks, "perplexity": round(self.perplexity, 4)}

    @classmethod
    def from_json(cls, d: dict) -> "TextFigure":
        return cls(d["name"], d["sha256"], int(d["tokens"]), int(d["chunks"]), float(d["perplexity"]),
                   int(d.get("chars", 0)))


@dataclass(frozen=True)
class ProbeAnswer:
    probe: str
    concurrency: int
    expected: str
    got: str
    ok: bool

    def to_json(self) -> dict:
        return {"probe": self.probe, "concurrency": self.concurrency, "expected": self.expected,
                "got": self.got, "ok": self.ok}


@dataclass(frozen=True)
class Measured:
    """What apply/verify.py read through the API. `figures` is empty when the server gave no
    prompt logprobs (`no_logprobs` says why; TensorFold's server may not)."""

    form: str  # "quick" or "full"
    figures: tuple[TextFigure, ...]
    answers: tuple[ProbeAnswer, ...]
    seconds: float
    no_logprobs: str | None = None


@dataclass(frozen=True)
class Baseline:
    """The figures of a deploy the owner trusts, for one checkpoint + recipe (`recipe`)."""

    recipe: dict
    figures: tuple[TextFigure, ...]
    recorded: str  # UTC time, ISO 8601

    def to_json(self) -> dict:
        return {"recipe": self.recipe, "recorded": self.recorded,
                "figures": [f.to_json() for f in self.figures]}

    @classmethod
    def from_json(cls, d: dict) -> "Baseline":
        return cls(dict(d["recipe"]), tuple(TextFigure.from_json(f) for f in d["figures"]), str(d["recorded"]))


@dataclass(frozen=True)
class Line:
    """One judged figure: what, the measured value, the bound it was held to, the verdict."""

    what: str
    measured: str
    bound: str
    ok: bool

    def to_json(self) -> dict:
        return {"what": self.what, "measured": self.measured, "bound": self.bound, "ok": self.ok}


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    form: str
    lines: tuple[Line, ...]
    measured: Measured
    baseline: Baseline | None
    notes: tuple[str, ...] = ()
    fix: str = ""
    context: tuple[tuple[str, str], ...] = field(default=CARD_FIGURES)

    @property
    def failed(self) -> tuple[Line, ...]:
        return tuple(line for line in self.lines if not line.ok)

    def summary(self) -> str:
        """One line: the verdict and the figures (what `up` prints)."""
        ppl = ", ".join(f"{f.name} {f.perplexity:.3f}" for f in self.measured.figures) or "perplexity not read"
        passed = sum(a.ok for a in self.measured.answers)
        verdict = "passed" if self.ok else "FAILED"
        return (f"verify ({self.form}) {verdict}: perplexity {ppl}; probes {passed}/{len(self.measured.answers)} "
                f"right; {self.measured.seconds:.1f} s")

    @property
    def message(self) -> str:
        """What the deploy history keeps beside the figures, and `up` says when it fails: the
        summary, and each failed line with its bound."""
        return "\n".join([self.summary(), *(f"  {line.what}: {line.measured} (want {line.bound})"
                                            for line in self.failed)])

    @property
    def figures(self) -> dict:
        """The figures the deploy history keeps (history.verdict): each text's perplexity and
        each concurrency's probes, against what (a baseline's time, or the sane bound)."""
        m = self.measured
        probes = {}
        for a in m.answers:
            right, total = probes.get(a.concurrency, (0, 0))
            probes[a.concurrency] = (right + a.ok, total + 1)
        return {"form": self.form, "seconds": round(m.seconds, 2),
                "perplexity": {f.name: round(f.perplexity, 4) for f in m.figures},
                "probes": {("alone" if n == 1 else f"{n} at once"): f"{r}/{t} right"
                           for n, (r, t) in sorted(probes.items())},
                "baseline": self.baseline.recorded if self.baseline else None,
                **({"no_logprobs": m.no_logprobs} if m.no_logprobs else {})}

    def to_json(self) -> dict:
        m = self.measured
        return {"ok": self.ok, "form": self.form, "seconds": round(m.seconds, 2),
                "figures": [f.to_json() for f in m.figures],
                "probes": [a.to_json() for a in m.answers],
                "lines": [line.to_json() for line in self.lines],
                "baseline": self.baseline.to_json() if self.baseline else None,
                "context_not_thresholds": [{"card": c, "figures": f} for c, f in self.context],
                "notes": list(self.notes), "fix": self.fix or None,
                "no_logprobs": m.no_logprobs}


def judge(measured: Measured, baseline: Baseline | None, logprobs_required: bool = True) -> VerifyResult:
    """Every figure against its bound: the baseline's when there is one for the same text (by
    hash), else the sane absolute bound; every probe answered right at every concurrency."""
    lines = [*_perplexity_lines(measured, baseline), *_probe_lines(measured)]
    notes = []
    if measured.no_logprobs:
        lines.append(Line("prompt logprobs", "missing", "required (vLLM's /v1/completions "
                          "prompt_logprobs)", not logprobs_required))
        notes.append(measured.no_logprobs)
    if baseline is None and measured.figures:
        notes.append(f"no baseline for this checkpoint + recipe: perplexity held to the sane bound "
                     f"{SANE_PERPLEXITY:g}; record one on a deploy you trust: sparkstack verify --full --record-baseline")
    ok = all(line.ok for line in lines)
    return VerifyResult(ok, measured.form, tuple(lines), measured, baseline, tuple(notes),
                        "" if ok else _fix(lines, baseline))


def _perplexity_lines(measured: Measured, baseline: Baseline | None) -> list[Line]:
    known = {f.key: f for f in baseline.figures} if baseline else {}
    lines = []
    for f in measured.figures:
        base = known.get(f.key)
        if base:
            bound = base.perplexity * (1 + BASELINE_TOLERANCE)
            lines.append(Line(f"perplexity {f.name}", f"{f.perplexity:.3f}",
                              f"<= {bound:.3f} (baseline {base.perplexity:.3f} + {BASELINE_TOLERANCE:.0%})",
                              f.perplexity <= bound))
        else:
            lines.append(Line(f"perplexity {f.name}", f"{f.perplexity:.3f}",
                              f"<= {SANE_PERPLEXITY:g} (sane bound, no baseline for this text)",
                              f.perplexity <= SANE_PERPLEXITY))
    return lines


def _probe_lines(measured: Measured) -> list[Line]:
    lines = []
    for n in sorted({a.concurrency for a in measured.answers}):
        at = [a for a in measured.answers if a.concurrency == n]
        wrong = [a for a in at if not a.ok]
        shown = "; ".join(f"{a.probe}: {a.got.strip()[:24]!r} (want {a.expected!r})" for a in wrong[:3])
        lines.append(Line("probes " + ("alone" if n == 1 else f"{n} at once"),
                          f"{len(at) - len(wrong)}/{len(at)} right" + (f": {shown}" if wrong else ""),
                          "all right", not wrong))
    return lines


def _fix(lines: list[Line], baseline: Baseline | None) -> str:
    failed = [line.what for line in lines if not line.ok]
    if failed == ["prompt logprobs"]:
        return ("serve with an engine that gives prompt logprobs (vLLM's /v1/completions "
                "prompt_logprobs), or skip verification on purpose with --no-verify")
    crowded_only = all(w.startswith("probes ") and w != "probes alone" for w in failed)
    if crowded_only:
        return ("the model answers right alone but wrong when requests batch: a tensor-parallel kernel "
                "of the serving image is broken under concurrency (seed 003); go back to the last image "
                "that verified, or fix the overlay, then `sparkstack up --restart`")
    if baseline is not None and not any(w.startswith("probes") for w in failed):
        return ("perplexity moved beyond the baseline's tolerance: the image's overlays or the checkpoint "
                "changed how the model reads; go back to the recipe that recorded the baseline, or, if "
                "this deploy is trusted, record it: sparkstack verify --full --record-baseline")
    return ("the served model emits wrong tokens (a runtime that narrows a shard or misplaces a vocab "
            "shard loads without error and emits gibberish, seed 003): check the image chain's "
            "overlays and the checkpoint against the last recipe that verified, then `sparkstack up --restart`")
