"""Shipping against the sandbox: real registry, real SSH forwards, each rank's own dockerd."""

import io
import json
import time
import uuid

import docker
import pytest
from click.testing import CliRunner

from launcher import ship
from launcher.cli import main

RUN_ID = uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def client():
    return docker.from_env()


def build_on(client, parent: str, name: str, payload_bytes: int) -> str:
    """A small image over `parent` whose top layer holds `payload_bytes` of random data."""
    dockerfile = (f"FROM {parent}\nRUN head -c {payload_bytes} /dev/urandom > /opt/payload-{name}\n"
                  f"LABEL org.sparkstack.test={RUN_ID}\n")
    ref = f"sparkstack-test/ship:{name}-{RUN_ID}"
    client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=ref, rm=True)
    return ref


@pytest.fixture(scope="module")
def images(sandbox, client):
    base = build_on(client, sandbox.images["vllm"], "v1", 1_000_000)
    top = build_on(client, base, "v2", 2_000_000)
    yield base, top
    for ref in (top, base):
        client.images.remove(ref, force=True)
    for name in sandbox.names:  # leave the ranks as they were
        sandbox.run(name, f"docker rmi -f {top} {base} >/dev/null 2>&1; true")


def rank_image_id(sandbox, name, ref):
    rc, out, _ = sandbox.run(name, f"docker image inspect --format '{{{{.Id}}}}' {ref}")
    return out.strip() if rc == 0 else None


def ship_refs(group, client, refs):
    plan = ship.make_plan(group, ship.local_image_ids(refs, client))
    return ship.apply(plan, group, say=lambda line: None)


def test_ship_then_nothing_moves_and_only_the_top_layer_moves_next(sandbox, group, client, images):
    base, top = images
    first = ship_refs(group, client, [base])
    assert [r.status for r in first.ranks] == ["shipped"] * 4, [r.error for r in first.ranks]
    want = client.images.get(base).id
    assert all(rank_image_id(sandbox, n, base) == want for n in sandbox.names)
    # no registry-named leftovers on the ranks
    rc, out, _ = sandbox.run("spark1", "docker images --format '{{.Repository}}'")
    assert "127.0.0.1:" not in out

    started = time.monotonic()
    again = ship.make_plan(group, ship.local_image_ids([base], client))
    assert [r.status for r in again.ranks] == ["up-to-date"] * 4
    assert ship.apply(again, group).ranks[0].bytes == 0
    assert time.monotonic() - started < 5

    layer = client.images.get(top).history()[1]["Size"]  # the RUN layer (LABEL adds none)
    assert 1_900_000 < layer < 2_200_000
    second = ship_refs(group, client, [top])
    for r in second.ranks:
        assert r.status == "shipped"
        # random bytes do not compress: the layer itself crossed, and little else
        assert 0.95 * layer <= r.bytes <= 1.1 * layer, f"rank {r.rank} moved {r.bytes} B for a {layer} B layer"


def test_a_rank_without_docker_fails_alone_and_reship_completes(sandbox, group, client, images):
    _, top = images
    extra = build_on(client, top, "v3", 300_000)
    victim = "sparkstack-spark3"
    try:
        client.containers.get(victim).exec_run("pkill -x dockerd")
        time.sleep(1)
        plan = ship_refs(group, client, [extra])
        by_rank = {r.rank: r for r in plan.ranks}
        assert [by_rank[i].status for i in (0, 1, 3)] == ["shipped"] * 3
        assert by_rank[2].status == "failed"
        assert "rank 2 (spark3)" in by_rank[2].error and "Docker daemon not running" in by_rank[2].error
    finally:
        _restart_dockerd(client, victim)
    assert rank_image_id(sandbox, "spark3", extra) is None  # no partial tag
    plan = ship_refs(group, client, [extra])
    assert [r.status for r in plan.ranks] == ["up-to-date", "up-to-date", "shipped", "up-to-date"]
    assert rank_image_id(sandbox, "spark3", extra) == client.images.get(extra).id
    client.images.remove(extra, force=True)
    for name in sandbox.names:
        sandbox.run(name, f"docker rmi -f {extra} >/dev/null 2>&1; true")


def _restart_dockerd(client, container: str) -> None:
    c = client.containers.get(container)
    c.exec_run("sh -c 'dockerd --storage-driver=overlay2 --mtu=1400 --bip=10.77.0.1/24 "
               ">>/var/log/dockerd.log 2>&1 &'", detach=True)
    for _ in range(100):
        if c.exec_run("docker info").exit_code == 0:
            return
        time.sleep(0.2)
    raise AssertionError(f"dockerd did not come back in {container}")


def test_cli_json_and_dry_run(sandbox, images):
    base, _ = images
    runner = CliRunner()
    result = runner.invoke(main, ["ship", "-c", str(sandbox.config), "--image", base, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [r["rank"] for r in data["ranks"]] == [0, 1, 2, 3]
    assert set(data["ranks"][0]) == {"rank", "host", "images", "bytes", "seconds", "status", "error"}
    assert {r["status"] for r in data["ranks"]} == {"up-to-date"}


def test_missing_local_image_is_a_clear_error(sandbox):
    result = CliRunner().invoke(main, ["ship", "-c", str(sandbox.config), "--image", "no/such:image"])
    assert result.exit_code == 1
    assert "image no/such:image is not on this host: run `sparkstack build`" in result.output
