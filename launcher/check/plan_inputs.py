"""What the plan needs from this host, read here so that launcher/plan/ stays pure: the
checkpoint's shape and weight split (config.json and the safetensors headers), the serving
image's tag (the local Docker's ID of the base), and the API key as kept on this host.

`check`, `up`, `down`, `prep` and `plan` gather through here and hand the result to the plan.
"""

from __future__ import annotations

from pathlib import Path

from ..facts.checkpoint import CheckpointError, read_shape, split_weights
from ..facts.record import Facts
from ..images import build as image_build
from ..inputs import apikey
from ..inputs.config import Loaded
from ..plan import cluster_plan as plan


def read_model(loaded: Loaded) -> plan.ModelFacts:
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
        return plan.ModelFacts(profile.shape(), None, (f"model shape: profile {profile.name}'s figures ({e})",))
    tp, pp = plan.parallelism(loaded)
    try:
        return plan.ModelFacts(shape, split_weights(model_dir, shape, tp, pp))
    except CheckpointError as e:
        return plan.ModelFacts(shape, None, (f"weights per rank: profile {profile.name}'s figures ({e})",))


def gather(loaded: Loaded, facts: dict[int, Facts] | None = None,
           key: apikey.ApiKey | None = None) -> plan.Gathered:
    """Everything the plan reads: `facts` as the probe found them (none: planned offline) and
    `key`, by default the API key as kept on this host (read, never made)."""
    key = key or apikey.resolve(loaded)
    model = read_model(loaded)
    image, image_assumed = image_build.serving_image(loaded)
    return plan.Gathered(model, image, key, facts or {}, tuple(image_assumed))


def build_plan(loaded: Loaded, facts: dict[int, Facts] | None = None,
               key: apikey.ApiKey | None = None) -> plan.Plan:
    """The plan from what this host and `facts` give (gather, then plan.build)."""
    return plan.build(loaded, gather(loaded, facts, key))


def memory_need(loaded: Loaded) -> plan.MemoryNeed:
    """The least MemAvailable a rank needs, from the checkpoint as read here (plan.memory_need)."""
    return plan.memory_need(loaded, read_model(loaded))
