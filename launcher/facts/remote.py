"""Named facts read from a rank by one shell command each: which images it holds (by ID),
its serving container's state, its MemAvailable. Each is a command and the parser of what it
prints, so `ship`, `build`, `serve` and `prep` ask the same way and read the answer in one place.

No SSH here: the caller runs the command (one rank, or a group of them at once) over the
connection it holds, and hands the output to the parser.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass

from .memory import parse_meminfo
from .parts import FactError

# The serving container and its memory guard's pid file, named here for every layer: the probe
# reads both (gather/ahead.py); plan/cluster_plan.py and apply/servguard.py take these names.
CONTAINER_NAME = "sparkstack-engine"
GUARD_DIR = "$HOME/.cache/sparkstack/memguard"
GUARD_PIDFILE = "guard.pid"

MEMINFO_COMMAND = "cat /proc/meminfo"


# --- image IDs ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class RankImage:
    id: str
    label: str = ""  # the value of the label asked for; "" when none was asked or the image has none


def image_ids_command(refs: list[str], label: str | None = None) -> str:
    """Prints `<ref> <image ID>[ <label's value>]` for each ref the rank has, nothing for one
    it lacks; fails (the daemon's own words on stderr) when Docker does not answer."""
    quoted = " ".join(shlex.quote(r) for r in refs)
    fmt = "{{.Id}}" + (f' {{{{index .Config.Labels "{label}"}}}}' if label else "")
    return (f'for r in {quoted}; do i=$(docker image inspect --format {shlex.quote(fmt)} "$r" 2>/dev/null) '
            f"&& echo \"$r $i\"; done; docker version --format '{{{{.Server.Version}}}}' >/dev/null")


def parse_image_ids(stdout: str) -> dict[str, RankImage]:
    """ref -> what `image_ids_command` found; a line not `<ref> sha256:…` (a login banner) is not ours."""
    found = {}
    for line in stdout.splitlines():
        ref, _, rest = line.partition(" ")
        image_id, _, label = rest.partition(" ")
        if image_id.startswith("sha256:"):
            found[ref] = RankImage(image_id, label)
    return found


# --- the serving container ---------------------------------------------------------------------

@dataclass(frozen=True)
class ContainerState:
    status: str                # Docker's words: running | exited | created | …
    exit_code: int | None
    oom_killed: bool
    started_at: str | None
    image: str | None
    label: str | None          # the value of the label asked for
    extra: tuple[str | None, ...] = ()  # the values of the extra labels asked for, in order
    id: str | None = None      # the container's ID (read by the probe only)


def container_state_command(name: str, label: str, extra: tuple[str, ...] = ()) -> str:
    """Prints `<State as JSON>\\t<label's value>\\t<image>[\\t<extra label's value>...]`, or
    `absent` when there is no such container (or no Docker that answers: the caller tells those
    apart by the exit status)."""
    extras = "".join("\t{{index .Config.Labels \"" + x + "\"}}" for x in extra)
    return ("docker inspect --format '{{json .State}}\t{{index .Config.Labels \"" + label
            + "\"}}\t{{.Config.Image}}" + extras + "' " + name + " 2>/dev/null || echo absent")


def parse_container_state(stdout: str, extra: int = 0) -> ContainerState | None:
    """None for `absent`; FactError, quoting the line, for output of another shape."""
    lines = [x for x in stdout.splitlines() if x.strip()]
    line = lines[-1].rstrip("\r") if lines else ""  # a banner a login shell prints first is not ours;
    # the line's own trailing tabs are kept: they separate labels left empty
    if line == "absent":
        return None
    try:
        return _state_of(line, extra)
    except (ValueError, KeyError, TypeError, AttributeError) as e:  # JSON errors are ValueErrors
        raise FactError(f"`docker inspect` printed {line!r:.200}, not the container's state ({e})") from None


def _state_of(line: str, n_extra: int) -> ContainerState:
    fields = line.split("\t")
    if len(fields) != 3 + n_extra:
        raise ValueError(f"{len(fields)} fields, not {3 + n_extra}")
    state_json, label, image, *extra = fields
    state = json.loads(state_json)
    status, code, started = state["Status"], state.get("ExitCode"), state.get("StartedAt")
    if not isinstance(status, str) or type(code) not in (int, type(None)) \
            or type(started) not in (str, type(None)):
        raise ValueError("State.Status, ExitCode or StartedAt of another type")
    return ContainerState(status, code, bool(state.get("OOMKilled")), started, image, label or None,
                          tuple(x if x and x != "<no value>" else None for x in extra))


def parse_probed_container(raw: dict, label: str, extra: tuple[str, ...] = ()) -> ContainerState | None:
    """The probe's `container` part (the whole inspect JSON, from the Engine API or the CLI)
    as `container_state_command` reads it; None when there is no such container. FactError when
    Docker did not answer, or answered in another shape."""
    if "api" in raw:
        answer = raw["api"]
        if answer.get("status") == 404:
            return None
        if answer.get("status") != 200:
            raise FactError(f"the Engine API on the container: {answer.get('error') or answer.get('status')}")
        text = answer.get("body", "")
    else:
        answer = raw.get("cli") or {}
        if answer.get("rc") != 0:
            said = (answer.get("stderr") or "") + (answer.get("stdout") or "")
            if "no such" in said.lower():
                return None
            raise FactError(f"`docker inspect` of the container: {said.strip()[-200:] or answer}")
        text = answer.get("stdout", "")
    try:
        found = json.loads(text)
        state, config = found["State"], found["Config"]
        labels = config.get("Labels") or {}
        line = "\t".join([json.dumps(state), labels.get(label) or "", config.get("Image") or ""]
                         + [labels.get(x) or "" for x in extra])
        return dataclasses.replace(_state_of(line, len(extra)), id=found.get("Id"))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise FactError(f"the container's inspect JSON is not Docker's ({e})") from None


# --- memory ------------------------------------------------------------------------------------

def parse_mem_available(stdout: str) -> int | None:
    """MemAvailable in bytes from `MEMINFO_COMMAND`'s output (the probe's parser), None when
    the output is not a /proc/meminfo."""
    try:
        return parse_meminfo(stdout).available
    except FactError:
        return None
