"""THE gather step of `check` and `up`: one call, one value (value.Gathered).

Per rank, in parallel: the probe, then at once one more command that pings the peers' fabric IPs
and reads dockerd's capabilities (extras; begun beside the probe when the rank's targets last
time are kept here and the probe gives the same), and with model.local_path the staged copy's listing
(staged). This host's part (the checkpoint's shape, the image's tag and local ID, the API key)
runs meanwhile. Never raises for a rank's failure: a rank whose part raised is in the value like
one that did not answer, the others as they answered.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ..errors import SparkstackError
from ..images import build as image_build
from ..inputs import apikey
from ..inputs.config import Loaded
from . import extras, here, probe, staged as staged_mod
from .value import Gathered


def gather(loaded: Loaded, group, image: str | None = None,
           probed: dict[int, probe.RankFacts] | None = None) -> Gathered:
    """Everything `check` judges and `up` plans from, over the open Group. `image`: the serving
    image's ref to look for instead of the profile's. `probed`: this command's probe answers
    still true (`up`'s, prep changed nothing they read): a rank that has one is not probed again."""
    staged: dict[int, dict | str] = {}

    def rank(conn) -> tuple[probe.RankFacts, list[extras.PingTarget], extras.Extras | None]:
        """Probe, then at once this rank's pings: no waiting for the slowest rank's probe. The
        pings to last time's targets go beside the probe, kept when the targets are the same."""
        r = conn.target.rank
        found = (probed or {}).get(r)
        guessed, early = None, None
        if found is None or found.facts is None:
            guessed = extras.remembered_targets(loaded, r)
            early = probe.in_background(_pings, conn, guessed) if guessed is not None else None
            found = probe.probe_rank(conn, loaded)
        if found.facts is None:
            return found, [], None
        targets = extras.rank_ping_targets(loaded, r, found.facts)
        result = early.result() if early is not None and guessed == targets else _pings(conn, targets)
        extras.remember_targets(loaded, r, targets)
        extra = extras.parse_extras(result.stdout, targets) if result.ok else extras.Extras({}, error=result.why())
        if loaded.cluster.model.local_path:  # the staged copy against its source, by size and mtime
            staged[conn.target.rank] = staged_mod.list_rank(conn, loaded)
        return found, targets, extra

    with ThreadPoolExecutor(max_workers=1) as local:
        mine = local.submit(this_host, loaded, image)
        answers = [o.value if o.ok else (probe.failed(o), [], None) for o in group.gather(rank)]
        found = mine.result()
    found.ranks = {g.rank: g for g, _, _ in answers}
    facts = found.facts
    found.targets = {g.rank: extras.resolve_peers(t, facts) for g, t, _ in answers if g.facts is not None}
    found.extras = {g.rank: e for g, _, e in answers if e is not None}
    found.staged = staged
    return found


class Begun:
    """`gather` under way in a thread from now (`check` begins it before importing the rest of
    itself); `result()` waits for it, raising what it raised."""

    def __init__(self, loaded: Loaded, group, image: str | None = None):
        self.group = group
        self._future = probe.in_background(gather, loaded, group, image)

    def result(self) -> Gathered:
        return self._future.result()


def _pings(conn, targets: list[extras.PingTarget]):
    command, stdin = extras.extras_invocation(targets)
    return conn.run(command, stdin=stdin, timeout=extras.PING_WAIT_S + 10)


def from_probe(loaded: Loaded, probed: dict[int, probe.RankFacts], image: str | None = None) -> Gathered:
    """The plan's part of the value from the probe answers alone (no pings, no staged listing):
    what `up` compares a serving cluster's containers with. `image`: as `gather`'s."""
    found = this_host(loaded, image)
    found.ranks = dict(probed)
    return found


def this_host(loaded: Loaded, image: str | None = None) -> Gathered:
    """What this host knows: the checkpoint, the serving image's tag and ID, the API key as kept
    here (read, never made); the ranks' part still empty. Never raises for the checkpoint: a
    model that cannot be read is `model_error`, judged by `check`'s memory row."""
    model, model_error = None, None
    try:
        model = here.read_model(loaded)
    except SparkstackError as e:
        model_error = e.message
    assumed: list[str] = []
    image_error = None
    if image is None:
        image, assumed = image_build.serving_image(loaded)
        if image.endswith(":unbuilt"):
            image_error = "; ".join(assumed)
    local_id = image_build.local_base_id(image) if image_error is None else None
    return Gathered(loaded, {}, model, image, apikey.resolve(loaded), tuple(assumed), model_error,
                    image_error, local_id, image_caps=here.image_caps(loaded))
