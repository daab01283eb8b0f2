"""Secrets kept out of what sparkstack prints: environment values whose names look secret (or
that cluster.yaml marks secret in overrides.secret_env) are shown as ***, and every secret value
the run has seen is replaced by *** in error messages (a log tail may echo one).

Nothing here hides a secret from a rank: it keeps them off the screen, out of logs and out of
`--json` output (`plan --show-secrets` prints them on request).
"""

from __future__ import annotations

import re

MASK = "***"
# HF_TOKEN, OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD, ...: masking a harmless name
# (TOKENIZERS_PARALLELISM) costs nothing, showing a secret does
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASS|CREDENTIAL", re.IGNORECASE)
_MIN_SCRUBBED = 8  # shorter values ("none", "1") would garble every message they occur in

_seen: set[str] = set()


def is_secret(name: str, marked=()) -> bool:
    return bool(SECRET_NAME.search(name)) or name in marked


def env(values: dict[str, str], marked=()) -> dict[str, str]:
    """The environment with each secret value shown as ***."""
    return {k: MASK if is_secret(k, marked) else v for k, v in values.items()}


def secret_values(values: dict[str, str], marked=()) -> list[str]:
    return [v for k, v in values.items() if is_secret(k, marked)]


def remember(*values: str | None) -> None:
    """Secret values this run holds: `scrub` hides them wherever they turn up."""
    _seen.update(v for v in values if v and len(v) >= _MIN_SCRUBBED)


def scrub(text: str) -> str:
    for value in sorted(_seen, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text
