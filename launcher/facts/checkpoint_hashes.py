"""The checkpoint's files hashed on a rank: which files (every shard, and the config and index the
rank has), the command that hashes them (sha256sum) and its parser. Pure: the command is run by
the caller (launcher/gather/hashes.py)."""

from __future__ import annotations

import shlex

from .record import Facts

EXTRA_FILES = ("config.json", "model.safetensors.index.json")


def files(f: Facts) -> list[str]:
    """The files hashed: every shard and the config and index the rank has."""
    c = f.checkpoint
    names = [n for n, _ in c.shards] if c else []
    extra = [n for n, sha in zip(EXTRA_FILES, (c.config_sha256, c.index_sha256)) if sha] if c else []
    return extra + names


def hash_command(path: str, names: list[str]) -> str:
    """sha256sum over `names` in `path`; a missing or unreadable file is said on stderr and the
    others are still hashed."""
    return f"cd -- {shlex.quote(path)} && sha256sum -- {' '.join(shlex.quote(n) for n in names)}"


def parse(stdout: str) -> dict[str, str]:
    """sha256sum's `HASH  NAME` lines into {name: hash}."""
    found = {}
    for line in stdout.splitlines():
        digest, _, name = line.partition("  ")
        if len(digest) == 64 and name:
            found[name.lstrip("*")] = digest
    return found
