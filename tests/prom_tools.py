"""Shared by the tests that run Debian's prometheus and prometheus-alertmanager here: a free
loopback port, and waiting for a server's /-/ready."""

from __future__ import annotations

import socket
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, timeout: float) -> bool:
    """True once `url`/-/ready answers 200 (Prometheus and Alertmanager both serve it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/-/ready", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False
