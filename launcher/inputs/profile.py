"""Serving profiles (`env/profiles/<name>.yaml`): one recipe from the seeds each.

A profile holds the image (a chain of patch stages over a base, or a prebuilt image), the engine
and its arguments (written exactly as the seeds give them, one flag per line in shell quoting),
the environment, the KV layout, and the figures the planner falls back on when the checkpoint
cannot be read (the model's shape and the weights per rank the seed reports).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PositiveInt, model_validator
from pydantic_core import PydanticCustomError

from . import capabilities, vllm_flags
from .. import engines, resources
from ..errors import ConfigError, load_yaml_model
from ..facts.checkpoint import ModelShape

PROFILES_DIR = resources.PROFILES_DIR

# A memory figure in GiB: finite (an infinite one passes `ge` and overflows the byte arithmetic)
# and below a PiB.
Gib = Annotated[float, Field(ge=0, lt=2**20, allow_inf_nan=False)]


def _env_vars(env: dict[str, str]) -> dict[str, str]:
    """A container's env travels as `KEY=value` lines (serve.run_command) and `-e KEY=value`: a
    name with `=`, a space or a newline, or a value with a newline, would set something else."""
    for key, value in env.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"{key!r} is not an environment variable name (letters, digits and _, "
                             "not starting with a digit)")
        if "\n" in value or "\0" in value:
            raise ValueError(f"{key}: the value has a line break or NUL, which an env file cannot carry")
    return env


EnvVars = Annotated[dict[str, str], AfterValidator(_env_vars)]


def one_of(known):
    """A validator taking only what `known()` lists (the engines' names, their multi-node modes:
    launcher/engines/), refused as an unknown Literal is."""
    def check(value):
        names = known()
        if value not in names:
            expected = " or ".join(", ".join(repr(k) for k in names).rsplit(", ", 1))
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
        return value
    return BeforeValidator(check)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Capability = Annotated[str, AfterValidator(capabilities.check_name)]


class ImageSpec(Strict):
    chain: list[str] = []
    base: str | None = None
    prebuilt: str | None = None
    # what the base (or the prebuilt image) registers beyond stock vLLM 0.33; each chain stage
    # says its own in images/<stage>/stage.yaml `brings` (launcher/inputs/capabilities.py).
    # Absent: not declared, so `plan` cannot judge the image (check's engine row still asks it)
    brings: list[Capability] | None = None

    @model_validator(mode="after")
    def _one_kind(self):
        if bool(self.prebuilt) == bool(self.chain or self.base):
            raise ValueError("give either `prebuilt`, or `base` with an optional `chain` of stages")
        return self


class KvTargetSpec(Strict):
    """The tokens the KV pool is sized to hold: the context × the sequences a seed meant to serve ×
    the margin its own pool had (seed 001: a 1.23M-token pool for a 1M context), and that source."""

    context: PositiveInt
    sequences: PositiveInt = 1
    margin: float = Field(1.0, ge=1, le=4, allow_inf_nan=False)
    source: str = Field(min_length=1)

    @property
    def tokens(self) -> int:
        return round(self.context * self.sequences * self.margin)


class KvRule(Strict):
    layout: Literal["fp8_ds_mla", "fp8", "bf16"]
    engine_managed: bool = False  # the engine sizes its own KV pool (TensorFold)
    target: KvTargetSpec | None = None  # None: the pool takes all that fits


class ShapeDefaults(Strict):
    num_hidden_layers: PositiveInt
    num_nextn_predict_layers: int = Field(0, ge=0)
    kv_lora_rank: PositiveInt
    qk_rope_head_dim: PositiveInt
    index_head_dim: int = Field(0, ge=0)


class Defaults(Strict):
    """Seed figures used when no checkpoint can be read; each use is listed as assumed."""

    model_shape: ShapeDefaults
    weights_per_rank_gib: Annotated[Gib, Field(gt=0)]
    mtp_weights_per_rank_gib: Gib = 0.0
    # config.json's figures vLLM's engine configuration reads (max_position_embeddings and
    # quantization_config.quant_method), for a plan made without the checkpoint
    max_position_embeddings: PositiveInt | None = None
    quant_method: str | None = None
    architecture: str | None = None  # config.json's architectures[0]


class LongContext(Strict):
    """A --max-model-len above the checkpoint's own maximum (config.json max_position_embeddings),
    wanted on purpose: the plan sets VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 and says why. `evidence`:
    what shows the model answers at that length (seed 000: a needle found at 979K tokens)."""

    evidence: str = Field(min_length=1)


class BenchDefaults(Strict):
    """Sampling `sparkstack bench` uses unless told otherwise (seed 000 measured at 0.6 / 0.95)."""

    temperature: float = Field(0.6, ge=0, allow_inf_nan=False)
    top_p: float = Field(0.95, gt=0, le=1)


class Profile(Strict):
    name: str = ""
    description: str
    seeds: list[str] = []
    engine: Annotated[str, one_of(engines.profile_engines)] = "vllm"  # which launcher/engines/ module serves it
    image: ImageSpec
    served_name: str
    api_port: int = Field(8000, ge=1, le=65535)
    args: list[str] = []
    plugin_flags: list[str] = []
    env: EnvVars = {}
    # the seed serves with swap off (seed 001: "no swap"): `prep` turns it off, `check` fails a
    # rank with swap on; cluster.yaml's overrides.no_swap wins
    no_swap: bool = False
    kv: KvRule
    defaults: Defaults
    bench: BenchDefaults = BenchDefaults()
    needs: list[Capability] = []  # what the flags need the serving image to register
    long_context: LongContext | None = None

    def flags(self) -> list[vllm_flags.Flag]:
        return vllm_flags.parse(vllm_flags.split_lines(self.args), frozenset(self.plugin_flags),
                                vllm_flags.PROFILE)

    def shape(self) -> ModelShape:
        return ModelShape(**self.defaults.model_shape.model_dump())



# A profile is a file name stem in its directory: no path separators, no hidden files.
PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def profile_names(directory: Path = PROFILES_DIR) -> list[str]:
    try:
        return sorted(p.stem for p in directory.glob("*.yaml"))
    except OSError:  # a directory that cannot be listed holds no profile we can name
        return []


def load_profile(name: str, directory: Path = PROFILES_DIR, named_in: str = "") -> Profile:
    """The profile `name`; `named_in` says where it was asked for ("cluster.yaml: profile")."""
    path = directory / f"{name}.yaml"
    if not PROFILE_NAME.fullmatch(name) or not _is_file(path):
        known = ", ".join(profile_names(directory)) or "none"
        where = f"{named_in}: " if named_in else ""
        why = f"no {path}" if PROFILE_NAME.fullmatch(name) else "not a profile name (letters, digits, . _ -)"
        raise ConfigError([f"{where}profile {name!r}: {why} (known profiles: {known})"])
    profile = load_yaml_model(path, Profile, "profile").model_copy(update={"name": name})
    if engines.pick(profile.engine).flags == engines.VLLM_FLAGS:
        try:
            profile.flags()
        except vllm_flags.FlagError as e:
            hint = ("; if a plugin adds it on purpose, list it under plugin_flags"
                    if isinstance(e, vllm_flags.UnknownFlagError) else "")
            raise ConfigError([f"{path}: args: {e}{hint}"]) from None
    return profile


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # e.g. a name too long, a directory we may not enter
        return False
