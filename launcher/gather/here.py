"""What the plan needs from this host, read here so that launcher/plan/ stays pure: the
checkpoint's shape and weight split (config.json and the safetensors headers), the serving
image's tag (the local Docker's ID of the base), and the API key as kept on this host.

`plan` (and `down`, `prep` for the memory need) read through here; `check` and `up` through
launcher/gather/cluster.py, which adds the ranks' part.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from ..facts.checkpoint import CheckpointError, ModelLimits, read_limits, read_shape, split_weights
from ..images import chain as image_chain
from ..inputs.capabilities import ImageCaps
from ..facts.record import Facts
from ..images import build as image_build
from ..inputs import apikey
from ..inputs.config import Loaded
from .probe import RankFacts
from .value import Gathered, ModelFacts, parallelism


def read_model(loaded: Loaded) -> ModelFacts:
    """The checkpoint as seen from here, else the profile's seed figures (noted in `assumed`).
    With model.local_path, the staged copy when this host has one, else its source (model.path):
    `check` compares every rank's copy with the source, file by file."""
    model = loaded.cluster.model
    model_dir = Path(model.serving_path)
    if model.local_path and not (model_dir / "config.json").is_file():
        model_dir = Path(model.path)
    profile = loaded.profile
    try:
        shape = read_shape(model_dir)
    except CheckpointError as e:
        limits, said = profile_limits(loaded, str(e))
        return ModelFacts(profile.shape(), None, (f"model shape: profile {profile.name}'s figures ({e})", *said),
                          limits)
    limits = read_limits(model_dir)  # config.json parsed already: read_shape did
    tp, pp = parallelism(loaded)
    try:
        return ModelFacts(shape, split_weights(model_dir, shape, tp, pp), limits=limits)
    except CheckpointError as e:
        return ModelFacts(shape, None, (f"weights per rank: profile {profile.name}'s figures ({e})",), limits)


def profile_limits(loaded: Loaded, why: str) -> tuple[ModelLimits | None, tuple[str, ...]]:
    """The model's limits from the profile's seed figures, when config.json cannot be read."""
    d = loaded.profile.defaults
    if d.max_position_embeddings is None and d.quant_method is None:
        return None, ()
    limits = ModelLimits(d.max_position_embeddings, "max_position_embeddings" if d.max_position_embeddings else None,
                         d.quant_method, "config.json" if d.quant_method else None,
                         sparse=loaded.profile.defaults.model_shape.index_head_dim > 0,
                         architectures=(d.architecture,) if d.architecture else ())
    return limits, (f"model limits: profile {loaded.profile.name}'s figures (max_position_embeddings "
                    f"{d.max_position_embeddings}, quant_method {d.quant_method}; {why})",)


def image_caps(loaded: Loaded) -> ImageCaps | None:
    """What the serving image brings, from the profile and the stages' metadata (None: the
    chain does not load, which `build` and the image row say)."""
    try:
        return image_chain.image_caps(loaded)
    except ConfigError:
        return None


def inputs(loaded: Loaded, facts: dict[int, Facts] | None = None,
           key: apikey.ApiKey | None = None) -> Gathered:
    """Everything the plan reads: `facts` as the probe found them (none: planned offline) and
    `key`, by default the API key as kept on this host (read, never made)."""
    key = key or apikey.resolve(loaded)
    model = read_model(loaded)
    image, image_assumed = image_build.serving_image(loaded)
    ranks = {r: RankFacts(r, loaded.cluster.ranks[r].label, f, None, 0.0) for r, f in (facts or {}).items()}
    return Gathered(loaded, ranks, model, image, key, tuple(image_assumed), image_caps=image_caps(loaded))


def addresses() -> set[str]:
    """This host's own IP addresses and names (`ip -j addr`, its hostname): where `fetch` writes
    depends on whether this host is the NFS export's server or rank 0."""
    import json as _json
    import socket
    import subprocess

    found = {"127.0.0.1", "::1", "localhost", socket.gethostname(), socket.getfqdn()}
    try:
        done = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, timeout=10)
        for link in _json.loads(done.stdout or "[]"):
            found.update(a["local"] for a in link.get("addr_info", []) if a.get("local"))
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    return found
