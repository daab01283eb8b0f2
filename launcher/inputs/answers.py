"""Answers the ranks gave, kept on this host: a question whose answer is a function of content
-addressed inputs (an image by its ID, a config.json by its sha256, the argv and env as text)
answers the same when asked again, so its yes is kept and given back instead of a `docker run`
on a rank (~0.5 s each). Only a yes is kept: a no is asked afresh, so a fix outside the key is
seen at once. One small JSON file per answer under the state dir (launcher/inputs/apikey.py);
a file that cannot be read or written is an answer not kept: the question is asked again.
Also kept here: a guess that saves a round trip only when it proves right (the ranks' ping
targets last time, launcher/gather/extras.py).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path

from .apikey import state_dir


def store() -> Path:
    return state_dir() / "answers"


def key(kind: str, *parts) -> str:
    """The file name of one question: its kind and a hash of everything the answer depends on."""
    text = json.dumps(parts, default=str, sort_keys=True)
    return f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:32]}"


def known(name: str, where: Path | None = None) -> dict | None:
    """The kept answer (with "at": when it was given), or None."""
    try:
        kept = json.loads(((where or store()) / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) else None


def keep(name: str, answer: dict, where: Path | None = None) -> None:
    where = where or store()
    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = where / f".{name}.tmp"
        at = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        tmp.write_text(json.dumps({**answer, "at": at}))
        tmp.replace(where / f"{name}.json")
    except OSError:
        pass  # not kept: asked again next time
