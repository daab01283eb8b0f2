"""The served API's key: cluster.yaml's overrides.api_key, else one generated once and kept on
this control host, else none on purpose (overrides.open_api: true, or an engine whose server
checks no key, e.g. TensorFold: launcher/engines/, `Engine.no_api_key`).

The generated key is `secrets.token_urlsafe(32)` in $XDG_STATE_HOME/sparkstack/api-keys/<rank 0's
address> (default ~/.local/state/...), the file mode 0600 in a 0700 folder: one key per API,
whichever config or profile serves there, kept across re-deploys. `resolve` only reads it (`plan`,
`check`, the kit's own clients); `resolve(create=True)` makes it the first time (`up`,
`sparkstack api-key`). Delete the file and run `up` to change the key.
"""

from __future__ import annotations

import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from .. import redact
from ..errors import SparkstackError
from .config import Loaded

CONFIG, GENERATED, NOT_YET, OPEN = "config", "generated", "not generated", "open"


class ApiKeyError(SparkstackError):
    exit_code = 2


@dataclass(frozen=True)
class ApiKey:
    value: str | None  # what the server checks and clients send; None: no key
    source: str  # CONFIG | GENERATED | NOT_YET | OPEN | the engine's (engines.NoApiKey.source)
    file: Path | None = None  # where a generated key is (or will be) kept
    engine_warning: str | None = None  # an engine whose server checks no key says why (NoApiKey)

    @property
    def warning(self) -> str | None:
        """Said by `plan` and `check` when the API is open to whoever reaches rank 0's port."""
        if self.engine_warning:
            return self.engine_warning
        if self.source == OPEN:
            return ("overrides.open_api: true: the API takes requests without a key from anyone "
                    "who reaches rank 0's API port")
        return None

    def describe(self, reveal: bool = False) -> str:
        shown = self.value if reveal else redact.MASK
        if self.source == CONFIG:
            return f"{shown} (overrides.api_key)"
        if self.source == GENERATED:
            return f"{shown} (generated, kept in {self.file})"
        if self.source == NOT_YET:
            return f"none yet: `sparkstack up` or `sparkstack api-key` generates it into {self.file}"
        return f"none ({self.warning})"

    def to_json(self, reveal: bool = False) -> dict:
        value = self.value if reveal or self.value is None else redact.MASK
        return {"key": value, "source": self.source, "file": str(self.file) if self.file else None,
                "warning": self.warning}


def state_dir() -> Path:
    """sparkstack's state on this host: $XDG_STATE_HOME/sparkstack, else ~/.local/state/sparkstack."""
    base = os.environ.get("XDG_STATE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path("~/.local/state").expanduser()) / "sparkstack"


def key_file(loaded: Loaded) -> Path:
    """One file per API: named after rank 0's address (which serves it), made filename-safe."""
    return state_dir() / "api-keys" / re.sub(r"[^A-Za-z0-9._-]", "_", loaded.cluster.ranks[0].address)


def resolve(loaded: Loaded, create: bool = False) -> ApiKey:
    """The key the API checks and the kit's clients send. Reads the generated key; makes it only
    with `create`."""
    o = loaded.cluster.overrides
    none = loaded.engine.no_api_key
    if none:
        return ApiKey(None, none.source, engine_warning=none.warning)  # its config check refuses an api_key
    if o.open_api:
        return ApiKey(None, OPEN)
    if o.api_key:
        return ApiKey(o.api_key, CONFIG)
    path = key_file(loaded)
    value = _read(path) if path.exists() else _create(path) if create else None
    redact.remember(value)
    return ApiKey(value, GENERATED if value else NOT_YET, path)


def _read(path: Path) -> str:
    try:
        value = path.read_text().strip()
    except OSError as e:
        raise ApiKeyError(f"{path}: cannot read the API key ({e.strerror}); fix its permissions, "
                          "or delete it and run `sparkstack up` to generate a new one") from None
    if not value or any(c.isspace() for c in value):
        raise ApiKeyError(f"{path}: not an API key (empty or several words); delete it and run "
                          "`sparkstack up` to generate a new one")
    return value


def _create(path: Path) -> str:
    """A new key, written 0600 beside a temporary name and linked into place, so two `up`s at
    once agree on one key (the second reads the first's)."""
    value = secrets.token_urlsafe(32)
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(value + "\n")
            os.link(temp, path)
        except FileExistsError:
            value = _read(path)
        finally:
            temp.unlink(missing_ok=True)
    except OSError as e:
        raise ApiKeyError(f"cannot keep the API key in {path} ({e.strerror}): set XDG_STATE_HOME to a "
                          "writable folder, or give the key in cluster.yaml's overrides.api_key") from None
    return value
