"""`sparkstack wait --timeout S` when the API does not come: it gives up after S seconds, exits 1
and says at which step it was stuck and what it last saw (a stand-in `vllm serve` on loopback)."""

from __future__ import annotations

import time

from serving import cli
from test_bench import Standin, free_port

KEY = "sk-wait"


def config(write_config, port: int):
    def edit(d):
        d["ranks"][0]["address"] = "127.0.0.1"
        d["overrides"].update(api_port=port, api_key=KEY)
    return str(write_config(edit))


def timed_wait(path: str, timeout: int):
    started = time.monotonic()
    result = cli("wait", "-c", path, "--timeout", str(timeout))
    return result, time.monotonic() - started


def test_wait_times_out_when_nothing_listens(write_config):
    port = free_port()
    result, took = timed_wait(config(write_config, port), 2)
    assert result.exit_code == 1, result.output
    assert (f"error: http://127.0.0.1:{port} not serving after 2 s: stuck at /health "
            "(ConnectError: ") in result.output
    assert took >= 2  # it waited the whole time before saying so


def test_wait_times_out_when_the_model_is_not_listed(write_config, tmp_path):
    """An engine that answers but serves another model: stuck at /v1/models, naming what it lists."""
    server = Standin(tmp_path, ["--served-model-name", "another-model", "--api-key", KEY])
    try:
        result, took = timed_wait(config(write_config, server.port), 2)
    finally:
        server.stop()
    assert result.exit_code == 1, result.output
    assert "/health: ok after" in result.output
    assert (f"error: http://127.0.0.1:{server.port} not serving after 2 s: stuck at /v1/models "
            "(models listed: another-model)") in result.output
    assert took >= 2
