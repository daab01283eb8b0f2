"""The api key row (rank 0 only): does the API ask for a key (launcher/inputs/apikey.py)?
"""

from __future__ import annotations

from ...facts.record import Facts
from ...inputs import apikey
from ...status import Status
from . import row
from .case import Case, RankReport


@row("api key", order=260, reads=("key",))
def _check_api_key(inp: Case, r: int, f: Facts, rr: RankReport) -> None:
    """Rank 0 serves the API on the host network: does it ask for a key (launcher/inputs/apikey.py)?"""
    if r != 0:
        return
    key = inp.api_key
    if key.warning:
        fix = ("remove overrides.open_api to serve with a generated key" if key.source == apikey.OPEN
               else "keep rank 0's API port on a private network, or put an authenticating proxy before it")
        rr.add("api key", Status.WARN, key.warning, fix)
    else:
        rr.add("api key", Status.PASS, "required: " + key.describe())
