"""The engines that serve the model, one module each behind one interface (launcher/engines/base.py,
`Engine`: SkyPilot's sky/provision/ is the model): vLLM with its native multi-node (vllm_native),
vLLM on Ray (vllm_ray), TensorFold (tensorfold).

An engine is picked once, by the profile's `engine:` and cluster.yaml's `multinode:` (`pick`), and
asked, wherever the kit would otherwise branch on its name: its template (templates/engine/), the
flags it manages, its rendezvous port, its config checks, whether its server checks an API key,
what the image must have before `up` starts it, what the plan notes of it.

Adding one: a module here that names an `Engine` subclass's instance `ENGINE` (found by `engines()`),
its template in templates/engine/, its stand-in in launcher/sandbox/standins/ (tests/test_engines.py
plans with a toy one).

Pure: no SSH, no Docker. May import `launcher.resources` and `launcher.errors` only.
"""

from __future__ import annotations

import importlib
import pkgutil

from ..errors import ConfigError
from .base import AS_WRITTEN, VLLM_FLAGS, Engine, ImageNeed, NoApiKey, RankStart

__all__ = ["AS_WRITTEN", "VLLM_FLAGS", "Engine", "ImageNeed", "NoApiKey", "RankStart", "engines",
           "multinode_modes", "pick", "profile_engines"]

_NOT_ENGINES = {"base"}
_found: list[Engine] = []


def engines() -> list[Engine]:
    """Every engine: each module of this package's path (but base) names one `ENGINE`; in their
    `listed` order."""
    if not _found:
        for info in pkgutil.iter_modules(__path__):
            if info.name not in _NOT_ENGINES and not info.name.startswith("_"):
                engine = importlib.import_module(f"{__name__}.{info.name}").ENGINE
                engine.name = info.name
                _found.append(engine)
        _found.sort(key=lambda e: e.listed)
    return list(_found)


def profile_engines() -> list[str]:
    """The values a profile's `engine:` may take."""
    return list(dict.fromkeys(e.profile_engine for e in engines()))


def multinode_modes() -> list[str]:
    """The values cluster.yaml's `multinode:` may take."""
    return list(dict.fromkeys(mode for e in engines() for mode in e.multinode or ()))


def pick(profile_engine: str, multinode: str | None = None) -> Engine:
    """The engine that serves a profile's `engine:` under cluster.yaml's `multinode:` (None: the
    first listed of that name, for what they share: how they take flags)."""
    for engine in engines():
        if engine.profile_engine == profile_engine and (multinode is None or engine.multinode is None
                                                        or multinode in engine.multinode):
            return engine
    raise ConfigError([f"engine {profile_engine!r} with multinode: {multinode}: no such engine "
                       f"(engines: {', '.join(profile_engines())})"])
