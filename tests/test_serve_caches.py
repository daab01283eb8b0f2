"""The compile caches on the sandbox (issue 15): the first `up` compiles, the second after a
`down` (as after a reboot) finds every rank's cache warm and skips it, `down --purge-caches`
makes the next one cold again."""

import json
import time

import pytest
import yaml

from serving import cli

COMPILE_S = 10


@pytest.fixture
def cfg(sandbox, tmp_path):
    data = yaml.safe_load(open(sandbox.config))
    data.setdefault("overrides", {}).setdefault("env", {})["SANDBOX_VLLM_COMPILE_S"] = str(COMPILE_S)
    path = tmp_path / "compile.yaml"
    path.write_text(yaml.safe_dump(data))
    yield str(path)
    cli("down", "-c", str(path), "--purge-caches")


def up_seconds(cfg) -> float:
    started = time.monotonic()
    result = cli("up", "-c", cfg, "--json")
    assert result.exit_code == 0, result.output
    return time.monotonic() - started


def caches(cfg) -> list:
    return [r["compile_cache"] for r in json.loads(cli("status", "-c", cfg, "--json").stdout)["ranks"]]


def engine_log(sandbox, name) -> str:
    rc, out, err = sandbox.run(name, "docker logs sparkstack-engine 2>&1")
    assert rc == 0, err
    return out


def test_second_up_skips_the_compile_and_purge_makes_it_cold(sandbox, cfg):
    purged = cli("down", "-c", cfg, "--purge-caches")
    assert purged.exit_code == 0, purged.output
    assert "compile caches under /var/cache/sparkstack removed" in purged.output
    assert caches(cfg) == [{}] * 4
    cold = up_seconds(cfg)
    for name in sandbox.names:
        assert "Compiling a graph for dynamic shape takes" in engine_log(sandbox, name)
    kept = caches(cfg)
    assert all(len(c) == 1 and list(c.values())[0] > 4096 for c in kept), kept  # one image, graphs + a kernel
    assert cli("down", "-c", cfg).exit_code == 0  # as a reboot would: the container is gone
    warm = up_seconds(cfg)
    for name in sandbox.names:
        assert "Directly load the compiled graph(s)" in engine_log(sandbox, name)
    assert cli("down", "-c", cfg, "--purge-caches").exit_code == 0
    assert caches(cfg) == [{}] * 4
    purged = up_seconds(cfg)
    assert "Compiling a graph for dynamic shape takes" in engine_log(sandbox, sandbox.names[0])
    print(f"\nup: cold compile cache {cold:.1f} s, warm {warm:.1f} s, cold again after --purge-caches {purged:.1f} s")
    # the rest of `up` varies by seconds here
    assert min(cold, purged) - warm > COMPILE_S * 0.5, (cold, warm, purged)
