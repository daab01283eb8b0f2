"""Building a rendered chain on the local Docker engine, stage by stage, base first.

A stage whose tag the engine already holds is not built: an unchanged chain costs one image
lookup per stage and nothing else. A missing stage is built with docker-py's low-level API from a
small in-memory context (its Dockerfile and its own files, never the patch directory), streaming
Docker's output to an event callback. A failure stops the chain and says which stage, which
Dockerfile line and what the build printed last; the stages before it stay tagged, and Docker
tags nothing that failed. The engine is reached through launcher.images.local_docker.
"""

from __future__ import annotations

import io
import re
import shlex
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Callable

from ..errors import SparkstackError
from ..status import Status
from ..facts import remote as rank_facts
from ..facts.remote import RankImage
from ..facts.image_ref import ImageRef
from .chain import LABEL, Base, Chain, RenderedStage, context_tar, instruction_lines
from .local_docker import LocalDocker

LAST_LINES = 15          # of build output, shown when a stage fails
_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# the classic builder's bookkeeping, left out of the output shown on failure
_NOISE = re.compile(r"^( ---> |Removing intermediate container |Successfully )")
_NONZERO = re.compile(r"^The command .* returned a non-zero code: (\d+)$", re.S)


class BuildError(SparkstackError):
    """The base is missing, or a stage failed to build (an engine that does not answer raises
    launcher.images.local_docker.LocalDockerError)."""


@dataclass(frozen=True)
class Event:
    """Progress for a display: kind is start | step | log | done | pull."""

    kind: str
    stage: str
    text: str = ""
    step: int = 0
    steps: int = 0
    result: StageResult | None = None


@dataclass(frozen=True)
class StageResult:
    name: str
    tag: str
    image_id: str
    built: bool
    seconds: float

    def to_json(self) -> dict:
        return {"name": self.name, "tag": self.tag, "image_id": self.image_id,
                "built": self.built, "seconds": round(self.seconds, 3)}


OnEvent = Callable[[Event], None]


def _quiet(_: Event) -> None:
    pass


def local_image_id(engine: LocalDocker, ref: str) -> str | None:
    return engine.image_id(ref)


def ensure_base(engine: LocalDocker, name: str, on_event: OnEvent = _quiet) -> Base:
    """The base image with its local ID, pulled first when the local Docker lacks it (its ID is
    part of every tag of the chain: see launcher/images/chain.py)."""
    image_id = engine.image_id(name)
    if image_id:
        return Base(name, image_id)
    import docker.errors

    on_event(Event("pull", "base", f"pulling {name}"))
    ref = ImageRef.parse(name)
    repo, tag = (name, None) if ref.digest else (ref.repository, ref.tag or "latest")
    try:
        for chunk in engine.api.pull(repo, tag=tag, stream=True, decode=True):
            if "error" in chunk:
                raise BuildError(f"base image {name}: not in the local Docker, and pulling it "
                                 f"failed: {chunk['error']}")
    except docker.errors.APIError as e:
        raise BuildError(f"base image {name}: not in the local Docker, and pulling it failed: "
                         f"{e.explanation or e}\n(load it with `docker load`, or name another in "
                         f"cluster.yaml images.base)") from None
    image_id = engine.image_id(name)
    if not image_id:
        raise BuildError(f"base image {name}: pulled, yet the local Docker does not list it")
    return Base(name, image_id)


def build_chain(engine: LocalDocker, chain: Chain, on_event: OnEvent = _quiet) -> list[StageResult]:
    """Build the stages Docker lacks, in order; return one result per stage."""
    results: list[StageResult] = []
    for stage in chain.stages:
        start = time.monotonic()
        image_id = engine.image_id(stage.tag)
        built = image_id is None
        if built:
            on_event(Event("start", stage.name, stage.tag))
            image_id = _build_stage(engine, stage, results, on_event)
        result = StageResult(stage.name, stage.tag, image_id, built, time.monotonic() - start)
        results.append(result)
        on_event(Event("done", stage.name, result=result))
    return results


def _build_stage(engine: LocalDocker, stage: RenderedStage, earlier: list[StageResult],
                 on_event: OnEvent) -> str:
    import docker.errors

    last: deque[str] = deque(maxlen=LAST_LINES)  # what the build printed last, for a failure
    step = [0]
    try:
        stream = engine.api.build(fileobj=io.BytesIO(context_tar(stage)), custom_context=True,
                                  tag=stage.tag, buildargs=stage.args, rm=True, forcerm=True,
                                  pull=False, decode=True)
        for chunk in stream:
            if "error" in chunk or "errorDetail" in chunk:
                detail = chunk.get("errorDetail", {}).get("message") or chunk.get("error", "")
                raise BuildError(_failure(stage, step[0], detail, last, earlier))
            _follow(stage, chunk.get("stream") or "", step, last, on_event)
    except (docker.errors.APIError, OSError) as e:  # OSError: requests' connection errors
        detail = getattr(e, "explanation", None) or str(e)
        raise BuildError(_failure(stage, step[0], detail, last, earlier)) from None
    image_id = engine.image_id(stage.tag)
    if image_id is None:
        raise BuildError(_failure(stage, step[0], "Docker finished without tagging the image", last, earlier))
    return image_id


def _follow(stage: RenderedStage, text: str, step: list[int], last: deque[str], on_event: OnEvent) -> None:
    """One chunk of Docker's build output: note the step, keep the telling lines, pass it on."""
    for line in _ANSI.sub("", text).splitlines():
        if not line.strip():
            continue
        if not _NOISE.match(line):
            last.append(line)
        m = _STEP.match(line)
        if m:
            step[0] = int(m.group(1))
            on_event(Event("step", stage.name, m.group(3), step[0], int(m.group(2))))
        on_event(Event("log", stage.name, line))


def _failure(stage: RenderedStage, step: int, detail: str, last: deque[str],
             earlier: list[StageResult]) -> str:
    """Which stage, which line of its rendered Dockerfile, what Docker said and printed last."""
    lines = instruction_lines(stage.dockerfile)
    where = ""
    if 0 < step <= len(lines):
        number, text = lines[step - 1]
        where = f" at Dockerfile line {number}: {_short(text)}"
    code = _NONZERO.match(detail.strip())
    said = f"the command exited with code {code.group(1)}" if code else detail.strip()
    out = [f"stage {stage.name} ({stage.template}) failed{where}", f"  docker: {said}"]
    shown = [line for line in last if not _STEP.match(line)]
    if shown:
        out.append("  last build output:")
        out += [f"    | {line}" for line in shown]
    kept = ", ".join(f"{r.name} {r.tag}" for r in earlier)
    out.append(f"  kept: {kept}" if kept else "  no stage of the chain was built before it")
    out.append(f"  nothing was tagged for {stage.name} or the stages after it; "
               f"`sparkstack build --render-only DIR` writes the rendered Dockerfiles")
    return "\n".join(out)


def _short(text: str, width: int = 160) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def local_base_id(name: str) -> str | None:
    """The base's image ID when the local Docker is reachable and holds it, else None; for
    `plan` and `--render-only`, which must not fail because Docker is away."""
    try:
        return LocalDocker(timeout=5).image_id(name)
    except Exception:  # noqa: BLE001 (LocalDockerError, or docker-py's own for a remote engine)
        return None


def local_chain(loaded) -> Chain:
    """The profile's chain tagged against the base as the local Docker holds it (by name when
    it does not): the tags `build` would give, computed without building."""
    from .chain import base_name, chain_for

    base = base_name(loaded)
    return chain_for(loaded, local_base_id(base) if base else None)


def serving_image(loaded) -> tuple[str, list[str]]:
    """The profile's serving image ref and what had to be assumed for it: a content tag
    (`sparkstack/<top>:<hash>`, over the base's ID when the local Docker has it), a prebuilt
    ref, or a `:unbuilt` placeholder with the reason."""
    from ..errors import ConfigError
    from .chain import base_name, chain_for, patches_dir

    spec, base_override = loaded.profile.image, loaded.cluster.images.base
    if spec.prebuilt:
        return base_override or spec.prebuilt, []
    top = spec.chain[-1] if spec.chain else "base"
    placeholder = f"sparkstack/{top}:unbuilt"
    try:
        patches_dir(loaded)
    except ConfigError:  # no patch files here: the tag cannot be computed
        return placeholder, [f"image: {placeholder} stands for the chain's content tag, which "
                             "`sparkstack build` computes"]
    base = base_name(loaded)
    base_id = local_base_id(base)
    try:
        chain = chain_for(loaded, base_id)
    except ConfigError as e:
        return placeholder, [f"image: {placeholder} stands for the chain's content tag; `sparkstack "
                             f"build` refuses the chain: {e.problems[0]}"]
    if base_id is None:
        return chain.top, [f"image: the base {base} is not in the local Docker: the chain's tags hash "
                           "its name, not its image ID (`sparkstack build` pulls it first)"]
    return chain.top, []


# ----------------------------------------------------------------------------------------------
# build --on-ranks: the same chain built by every rank's Docker, over SSH (launcher.transport.remote)

RANK_BUILD_TIMEOUT_S = 3600
_ID_MARK = "sparkstack-image-id "


@dataclass
class RankBuild:
    """One rank's part of `build --on-ranks`."""

    rank: int
    host: str
    status: Status = Status.UP_TO_DATE  # or BUILT, FAILED
    stages: list[dict] = field(default_factory=list)  # StageResult.to_json() of each stage done
    error: str | None = None
    seconds: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


def build_on_ranks(loaded, chain: Chain, say: Callable[[str], None] = lambda line: None,
                   group=None) -> list[RankBuild]:
    """`sparkstack build --on-ranks`: the same chain built on every rank in parallel.

    Each rank is asked once which of the base and the stages it holds; then, stage after stage,
    it builds those it lacks from `context_tar(stage)` on stdin (a few KB: never the patch
    directory). A stage counts as present only with the right chain label. One result per rank;
    a failing rank never stops the others. `group`: open connections (default: the config's)."""
    from ..transport import remote

    own = group is None
    if own:
        group = remote.Group.for_cluster(loaded.cluster, say=say)
    try:
        refs = [chain.base.name] + [s.tag for s in chain.stages]
        command = rank_facts.image_ids_command(refs, label=f"{LABEL}.chain")
        probes = {r.target.rank: r for r in group.run(command, timeout=60).results}
        have = {rank: _by_content(rank_facts.parse_image_ids(r.stdout)) for rank, r in probes.items() if r.ok}
        chain = _chain_for_ranks(loaded, chain, have)

        def one(conn) -> RankBuild:
            rank = _build_rank(conn, chain, probes[conn.target.rank], have.get(conn.target.rank, {}))
            say(_rank_line(conn.target.name, rank))
            return rank

        return [o.value if o.ok else _raised(o, say) for o in group.gather(one)]
    finally:
        if own:
            group.close()


def _by_content(have: dict[str, RankImage]) -> dict[str, RankImage]:
    """A containerd store's image IDs as the config digests they stand for (images/manifests.py)."""
    from dataclasses import replace

    from . import manifests, spool

    known = manifests.known(spool.SPOOL)
    return {ref: replace(image, id=manifests.content_id(image.id, known)) for ref, image in have.items()}


def _raised(outcome, say: Callable[[str], None]) -> RankBuild:
    """The RankBuild of a rank whose build raised: failed, with why."""
    rank = RankBuild(outcome.rank, outcome.target.address, Status.FAILED, error=outcome.why())
    say(_rank_line(outcome.target.name, rank))
    return rank


def _chain_for_ranks(loaded, chain: Chain, have: dict[int, dict[str, RankImage]]) -> Chain:
    """The tags hash the base's image ID. When this host lacks the base (the point of building
    on the ranks), take the ID most ranks hold and render the chain for it; ranks holding
    another base fail in _build_rank."""
    if chain.base.image_id or not chain.stages:
        return chain
    from collections import Counter

    from .chain import chain_for

    ids = Counter(h[chain.base.name].id for h in have.values() if chain.base.name in h)
    if not ids:
        return chain
    return chain_for(loaded, ids.most_common(1)[0][0], repository=chain.stages[0].tag.rpartition("/")[0])


def _build_rank(conn, chain: Chain, probe, have: dict[str, RankImage]) -> RankBuild:
    name = conn.target.name
    out = RankBuild(conn.target.rank, conn.target.address)
    started = time.monotonic()
    out.error = _base_problem(name, chain, probe, have)
    if out.error:
        out.status = Status.FAILED
        return out
    done: list[StageResult] = []
    for stage in chain.stages:
        t = time.monotonic()
        found = have.get(stage.tag, RankImage(""))
        image_id, built = found.id, found.label != stage.digest
        if built:
            result = conn.run(_rank_build_command(stage), stdin=context_tar(stage),
                              timeout=RANK_BUILD_TIMEOUT_S)
            image_id = _built_id(result.stdout) if result.ok else None
            if not image_id:
                out.status, out.error = Status.FAILED, f"{name}: " + _rank_failure(stage, result, done)
                break
            out.status = Status.BUILT
        done.append(StageResult(stage.name, stage.tag, image_id, built, time.monotonic() - t))
    out.stages = [r.to_json() for r in done]
    out.seconds = round(time.monotonic() - started, 3)
    return out


def _base_problem(name: str, chain: Chain, probe, have: dict[str, RankImage]) -> str | None:
    if not probe.ok:
        why = probe.why()
        if "Cannot connect to the Docker daemon" in why:
            why = f"Docker daemon not running ({why}); start it: sudo systemctl start docker"
        return why if why.startswith(name) else f"{name}: {why}"
    base = chain.base
    if base.name not in have:
        return (f"{name}: base image {base.name} is not on the rank; ship it "
                f"(`sparkstack ship --image {base.name}`) or load it there, then re-run")
    if base.image_id and have[base.name].id != base.image_id:
        return (f"{name}: base image {base.name} is {have[base.name].id} on the rank, not "
                f"{base.image_id} as elsewhere (the tags hash it); ship the same base "
                f"(`sparkstack ship --image {base.name}`), then re-run")
    return None


def _rank_build_command(stage: RenderedStage) -> str:
    """The classic builder (its `Step N/M` lines name the failing instruction), the context
    a tar on stdin; then the new image's ID."""
    args = " ".join(f"--build-arg {shlex.quote(f'{k}={v}')}" for k, v in sorted(stage.args.items()))
    tag = shlex.quote(stage.tag)
    return (f"DOCKER_BUILDKIT=0 docker build --force-rm -t {tag} {args} - && "
            f"echo {_ID_MARK}$(docker image inspect --format '{{{{.Id}}}}' {tag})")


def _built_id(stdout: str) -> str | None:
    marks = [line[len(_ID_MARK):].strip() for line in stdout.splitlines() if line.startswith(_ID_MARK)]
    return marks[-1] if marks and marks[-1].startswith("sha256:") else None


def _rank_failure(stage: RenderedStage, result, done: list[StageResult]) -> str:
    """Like a local failure: the stage, its Dockerfile line, what Docker said and printed last."""
    if result.error:  # the connection, not the build
        return f"stage {stage.name}: {result.error}"
    last: deque[str] = deque(maxlen=LAST_LINES)
    step = [0]
    _follow(stage, result.stdout, step, last, _quiet)
    said = [line for line in result.stderr.strip().splitlines() if line.strip()]
    detail = said[-1] if said else f"docker build exited {result.exit_status}"
    return _failure(stage, step[0], detail, last, done)


def _rank_line(name: str, rank: RankBuild) -> str:
    if rank.status == Status.FAILED:
        return f"{name}: FAILED: {rank.error}"
    parts = [f"{s['name']} {'built %.1fs' % s['seconds'] if s['built'] else 'up to date'}"
             for s in rank.stages]
    return f"{name}: {rank.status} ({', '.join(parts) or 'no stages'})"
