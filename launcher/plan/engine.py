"""The engine's command line in each rank's container, rendered from templates/engine/*.j2.

Python decides WHAT the engine is told (the flags, merged by `vllm_flags`: the profile's, the
config's overrides, and the ones the kit manages); the template decides HOW the container runs it
(`vllm serve ...`, a Ray head then `vllm serve`, a Ray worker, or `python3 -m tensorfold.cli
serve ...`).
A template renders one shell-quoted line; the plan keeps it as an argv list.
"""

from __future__ import annotations

import shlex
from functools import lru_cache
from pathlib import Path

import jinja2

from .. import resources

TEMPLATES_DIR = resources.TEMPLATES_DIR / "engine"
RAY_PORT = 6379  # Ray's default GCS port


@lru_cache(maxsize=None)
def _env(directory: Path) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(directory)),
                             undefined=jinja2.StrictUndefined, autoescape=False)
    env.filters["q"] = lambda value: shlex.quote(str(value))
    return env


def template_name(engine: str, multinode: str, n_ranks: int) -> str:
    if engine == "vllm" and multinode == "ray" and n_ranks > 1:
        return "vllm-ray.j2"
    return f"{engine}.j2"


def command(engine: str, multinode: str, *, rank: int, n_ranks: int, model: str, args: list[str],
            host_ip: str, head: str, directory: Path = TEMPLATES_DIR) -> list[str]:
    """The container's command (after the image) for this rank, as argv."""
    template = _env(directory).get_template(template_name(engine, multinode, n_ranks))
    line = template.render(rank=rank, n_ranks=n_ranks, model=model, args=args, host_ip=host_ip,
                           head=head, ray_port=RAY_PORT).strip()
    return shlex.split(line)
