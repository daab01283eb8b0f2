"""`up`'s first reads, begun before the rest of the command is even imported: the probe of every
rank with the serving container and its guard read with it, and one pass of the API question.
Both only read. The caller takes the cluster lock meanwhile and keeps them only when it took
the lock at once (nobody changed the cluster since); apply/steady.py reads what they say.
Kept light on purpose: only the probe and the API client are imported here.
"""

from __future__ import annotations

from ..facts.remote import CONTAINER_NAME, GUARD_DIR, GUARD_PIDFILE
from ..inputs.config import Loaded
from ..transport.remote import Group
from . import probe

# what the probe reads of the serving container and of the guard that watches it
SERVING = {"name": CONTAINER_NAME, "watcher_pidfile": f"{GUARD_DIR}/{GUARD_PIDFILE}"}


class Ahead:
    def __init__(self, loaded: Loaded, group: Group):
        self._probed = probe.in_background(probe.gather, group, loaded, container=SERVING)
        self._api = probe.in_background(_answers_now, loaded)

    def probed(self) -> dict[int, probe.RankFacts]:
        return self._probed.result()

    def answered(self) -> list[str] | None:
        """What the API question said when the API answered every step at once, else None."""
        try:
            return self._api.result()
        except Exception:  # noqa: BLE001 -- the real question is asked again
            return None


def _answers_now(loaded: Loaded) -> list[str] | None:
    from ..transport import api  # httpx: imported here, beside the probe, not before it

    return api.answers_now(api.endpoint(loaded))
