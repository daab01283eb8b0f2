"""The one value gather produces and the plan and `check` take (`Gathered`), and the part of it
that is the checkpoint as read here (`ModelFacts`). Types only: nothing here reads anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..facts.checkpoint import ModelLimits, ModelShape, WeightSplit
from ..facts.record import Facts
from ..inputs import apikey, vllm_flags
from ..inputs.capabilities import ImageCaps
from ..inputs.config import Loaded

if TYPE_CHECKING:  # the types only: the plan imports this module and stays away from SSH
    from .engine_config import EngineAnswer
    from .extras import Extras, PingTarget
    from .probe import RankFacts


@dataclass(frozen=True)
class ModelFacts:
    """What is known of the checkpoint: its shape and the weights on the fullest rank."""

    shape: ModelShape
    weights: WeightSplit | None  # None: the profile's per-rank figure is used
    assumed: tuple[str, ...] = ()  # what could not be read and was taken from the profile
    limits: ModelLimits | None = None  # config.json's max length and quantization (None: profile's figures)


@dataclass
class Gathered:
    """What the plan and `check` need beyond the config and the profile, read beforehand
    (launcher/gather/): the plan itself reads no file and asks no Docker, `check` only judges.

    The plan reads `model`, `image`, `image_assumed`, `key` and `facts`; `check` all of it."""

    loaded: Loaded
    ranks: dict[int, RankFacts]  # rank -> its probe's answer: facts, or why there are none
    model: ModelFacts | None  # None: model_error says why
    image: str  # the serving image's ref (a content tag, a prebuilt ref or a `:unbuilt` placeholder)
    key: apikey.ApiKey  # the API's key as kept on this host
    image_assumed: tuple[str, ...] = ()  # what the image's ref had to assume
    model_error: str | None = None  # why the checkpoint (or the parallelism) could not be read
    image_error: str | None = None  # why the image's tag is not known (chain not buildable here)
    local_image_id: str | None = None  # its ID on the build host, when Docker there has it
    targets: dict[int, list[PingTarget]] = field(default_factory=dict)  # whom each rank pinged
    extras: dict[int, Extras] = field(default_factory=dict)  # the pings' answers, dockerd's caps
    image_caps: ImageCaps | None = None  # what the serving image brings (None: not read)
    engine_answer: EngineAnswer | None = None  # the image's engine on the planned argv (engine_config.py)
    engine_unasked: str | None = None  # why it was not asked
    staged: dict[int, dict | str] = field(default_factory=dict)  # model.local_path vs model.path listings

    @property
    def facts(self) -> dict[int, Facts]:
        """Only the ranks that answered: rank -> the probe's Facts."""
        return {r: g.facts for r, g in self.ranks.items() if g.facts is not None}

    @property
    def known_image(self) -> str | None:
        """The serving image's ref, None while its tag is not known (image_error says why)."""
        return None if self.image_error else self.image


def parallelism(loaded: Loaded) -> tuple[int, int]:
    """(tensor-parallel, pipeline-parallel) sizes: the flags' values, else TP over every rank."""
    flags = loaded.flags
    tp = int(vllm_flags.value(flags, "tensor_parallel_size") or len(loaded.cluster.ranks))
    return tp, int(vllm_flags.value(flags, "pipeline_parallel_size") or 1)
