"""What an engine is asked: the `Engine` base class, whose members are the whole interface, and the
values the plan and apply pass to it or get back (`RankStart`, `ImageNeed`, `NoApiKey`).

An engine module subclasses `Engine`, overrides what differs and names one instance `ENGINE`
(launcher/engines/__init__.py finds it). Python decides WHAT the engine is told (the flags: the
profile's, the config's, and the ones the engine manages, `managed`); its template in
templates/engine/ decides HOW the container runs it (`vllm serve ...`, a Ray head then `vllm
serve`, a Ray worker, `python3 -m tensorfold.cli serve ...`). A template renders one shell-quoted
line; the plan keeps it as an argv list.

Pure: no SSH, no Docker, no file but the engine's own templates. The cluster and the profile are
passed in as they are (launcher/inputs' models) and only read.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from .. import resources

TEMPLATES_DIR = resources.TEMPLATES_DIR / "engine"

# How an engine takes the profile's `args` and overrides.engine_args (Engine.flags):
VLLM_FLAGS = "vllm"  # checked against vLLM 0.33's option table, merged by what each flag sets
AS_WRITTEN = "as written"  # passed after the managed flags as written; its own parser checks them


@dataclass(frozen=True)
class RankStart:
    """What the plan tells an engine of one rank's start: where it is, where rank 0 meets the
    others, what it serves, and the figures the plan sized (None: not the plan's to set)."""

    rank: int
    n_ranks: int
    model: str  # the checkpoint's directory on the rank (the staged copy when there is one)
    served: str  # the model's name in the API
    port: int  # the API's port
    host_ip: str  # the rank's own address on the rendezvous network
    master: str  # rank 0's rendezvous address
    master_port: int  # rank 0's rendezvous port (config.master_port)
    tp: int | None = None  # tensor parallel; None: the profile's or the config's flags set it
    kv_cache_bytes: int | None = None  # the KV pool the plan sized; None: the engine sizes its own
    utilization: float | None = None  # the --gpu-memory-utilization the plan chose; None: as written


@dataclass(frozen=True)
class ImageNeed:
    """A capability the serving image must have, checked on rank 0 before anything starts
    (launcher/apply/serve.py runs `argv` in the image, without network). The messages take
    {host} (rank 0's name), {image}, {why} (the failed run), {version} and {need}."""

    argv: tuple[str, ...]
    missing: str  # `argv` failed in the image (or printed no x.y.z version when one is needed)
    min_version: tuple[int, ...] | None = None  # the first x.y.z it prints must be at least this
    too_old: str = ""


@dataclass(frozen=True)
class NoApiKey:
    """An engine whose server checks no key: the plan's API source and what `plan`/`check` warn."""

    source: str
    warning: str


@lru_cache(maxsize=None)
def _env(directory: Path) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(directory)),
                             undefined=jinja2.StrictUndefined, autoescape=False)
    env.filters["q"] = lambda value: shlex.quote(str(value))
    return env


class Engine:
    """The interface, with the defaults of an engine that needs nothing special."""

    name: str = ""  # the module's name, e.g. vllm_native (set by launcher/engines/__init__.py)
    profile_engine: str = ""  # the profile's `engine:` that picks it
    multinode: tuple[str, ...] | None = None  # cluster.yaml `multinode:` values it serves; None: any
    template: str = ""  # its template in templates_dir
    templates_dir: Path = TEMPLATES_DIR
    flags: str = VLLM_FLAGS  # VLLM_FLAGS or AS_WRITTEN
    master_port: int = 29500  # rank 0's rendezvous port when cluster.yaml sets none
    startup_guard: bool = False  # vLLM's startup memory guard applies (launcher/inputs/vllm_guard.py)
    host_ip_env: str | None = None  # the variable that tells the engine the rank's own address
    no_api_key: NoApiKey | None = None  # set: its server checks no API key
    head_first: bool = False  # start rank 0 first, then the others (else the others first)
    shown_as: str = ""  # said when `up` starts it, e.g. "Ray"
    listed: int = 100  # where it comes among the engines (and a profile's `engine:` values)
    # its API gives vLLM's prompt_logprobs, which `verify` reads a perplexity from: True, a server
    # without them is refused; False, verify still asks, and judges by its probes alone when none come
    prompt_logprobs: bool = True

    def template_name(self, n_ranks: int) -> str:
        return self.template

    def managed(self, start: RankStart) -> list[tuple[str, tuple[str, ...]]]:
        """The flags the plan sets on this rank, as (option, values): merged over the profile's
        and the config's (VLLM_FLAGS) or put before them (AS_WRITTEN)."""
        return []

    def config_problems(self, path: Path, cluster, profile) -> list[str]:
        """What this engine refuses in a cluster config and its profile, each `file: field: why`."""
        return []

    def image_needs(self, n_ranks: int) -> tuple[ImageNeed, ...]:
        """What the serving image must have before `up` starts this engine on `n_ranks` ranks."""
        return ()

    def notes(self, master: str, n_ranks: int) -> list[str]:
        """What the plan tells the user before `up` (what stays open, what is ignored)."""
        return []

    def template_vars(self) -> dict:
        """Values the template reads beyond the rank's (e.g. Ray's port)."""
        return {}

    def command(self, start: RankStart, args: list[str]) -> list[str]:
        """The container's command (after the image) for this rank, as argv."""
        template = _env(self.templates_dir).get_template(self.template_name(start.n_ranks))
        line = template.render(rank=start.rank, n_ranks=start.n_ranks, model=start.model, args=args,
                               host_ip=start.host_ip, head=start.master, **self.template_vars()).strip()
        return shlex.split(line)
