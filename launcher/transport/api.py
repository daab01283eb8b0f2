"""The served OpenAI-compatible API on rank 0: where it is, and waiting until it answers."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from ..errors import SparkstackError
from ..inputs import apikey
from ..inputs.config import Loaded


class NotServing(SparkstackError):
    pass


@dataclass(frozen=True)
class Endpoint:
    url: str
    model: str
    api_key: str | None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


def endpoint(loaded: Loaded) -> Endpoint:
    """Rank 0's API as the config and profile say (the head serves it), with the key it checks
    (launcher/inputs/apikey.py: the config's, else the one `up` generated)."""
    cluster, profile = loaded.cluster, loaded.profile
    port = cluster.overrides.api_port or profile.api_port
    return Endpoint(f"http://{cluster.ranks[0].address}:{port}",
                    cluster.model.served_name or profile.served_name, apikey.resolve(loaded).value)


def health_check(ep: Endpoint, timeout: float = 3.0) -> tuple[bool, str]:
    """Whether /health answers 200, and what it answered (or why nothing did)."""
    try:
        r = httpx.get(f"{ep.url}/health", headers=ep.headers, timeout=timeout)
    except httpx.HTTPError as e:
        return False, f"{type(e).__name__}: {e}"
    return r.status_code == 200, f"HTTP {r.status_code}"


def health(ep: Endpoint, timeout: float = 3.0) -> bool:
    return health_check(ep, timeout)[0]


def wait_ready(ep: Endpoint, timeout: float, say=print, poll_s: float = 1.0, watch=None) -> float:
    """/health, then /v1/models lists the model, then one short completion answers.
    `watch()` runs between polls (e.g. raising when a rank's engine died meanwhile).
    Returns the seconds it took; raises NotServing naming the step it was stuck at."""
    started = time.monotonic()
    deadline = started + timeout
    for step, probe in (("/health", lambda e: health_check(e, timeout=5)), ("/v1/models", _model_listed),
                        ("a completion", _completes)):
        last = "no answer yet"
        while True:
            if watch:
                watch()
            try:
                ok, last = probe(ep)
            except httpx.HTTPError as e:
                ok, last = False, f"{type(e).__name__}: {e}"
            if ok:
                say(f"  {step}: ok after {time.monotonic() - started:.1f} s")
                break
            if time.monotonic() > deadline:
                raise NotServing(f"{ep.url} not serving after {timeout:.0f} s: stuck at {step} ({last})")
            time.sleep(poll_s)
    if watch:
        watch()  # every rank still up once the head answers
    return time.monotonic() - started


def _model_listed(ep: Endpoint) -> tuple[bool, str]:
    r = httpx.get(f"{ep.url}/v1/models", headers=ep.headers, timeout=5)
    if r.status_code != 200:
        return False, f"HTTP {r.status_code}"
    names = [m.get("id") for m in r.json().get("data", [])]
    return ep.model in names, f"models listed: {', '.join(map(str, names)) or 'none'}"


def _completes(ep: Endpoint) -> tuple[bool, str]:
    body = {"model": ep.model, "max_tokens": 4,
            "messages": [{"role": "user", "content": "Say OK."}]}
    r = httpx.post(f"{ep.url}/v1/chat/completions", json=body, headers=ep.headers, timeout=60)
    if r.status_code != 200:
        return False, f"HTTP {r.status_code}: {r.text[:200]}"
    return bool(r.json().get("choices")), "no choices in the answer"
