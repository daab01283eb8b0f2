"""A mixed fleet on the sandbox (issue 41): the default sandbox runs spark4's Docker on containerd's
image store (Docker 29+'s default), the others on the classic overlay2 store, real dockerd both.
A rank switched by hand, as an owner's Docker upgrade does it, is shipped to and served again with
no manual step, and put back. The data side is tests/test_docker_stores.py; the bytes a containerd
rank takes for a change are held with the others' in tests/test_ship.py."""

from __future__ import annotations

import json

import pytest

from serving import cli
from test_ship import rank_config

CONTAINERD_JSON = '{"features": {"containerd-snapshotter": true}}'


def store_of(sandbox, name: str) -> str:
    rc, out, err = sandbox.run(name, "docker info --format '{{json .DriverStatus}}'")
    assert rc == 0, err
    return "containerd" if "io.containerd.snapshotter.v1" in out else "classic"


def restart_dockerd(sandbox, name: str) -> None:
    """Stop the rank's dockerd and start it again as its init does (it reads daemon.json)."""
    script = ("pkill -x dockerd; for i in $(seq 100); do pgrep -x dockerd >/dev/null || break; sleep 0.1; done; "
              "setsid /usr/local/sbin/sandbox-dockerd </dev/null >/dev/null 2>&1 & "
              "for i in $(seq 150); do docker info >/dev/null 2>&1 && exit 0; sleep 0.2; done; exit 1")
    rc, out, err = sandbox.run(name, script, user="root", timeout=60)
    assert rc == 0, f"{name}'s dockerd did not come back: {out}{err}"


def test_the_default_sandbox_is_a_mixed_fleet(sandbox):
    assert [store_of(sandbox, n) for n in sandbox.names] == ["classic", "classic", "classic", "containerd"]


@pytest.fixture
def switched(sandbox):
    """spark2's Docker switched to containerd's image store by hand, as an upgrade to Docker 29
    leaves it; put back to the classic store (whose images come back into view) after."""
    name = "spark2"
    cfg = str(sandbox.config)
    was_serving = {r["state"] for r in json.loads(cli("status", "-c", cfg, "--json").stdout)["ranks"]} == {"running"}
    rc, _, err = sandbox.run(name, f"echo '{CONTAINERD_JSON}' > /etc/docker/daemon.json", user="root")
    assert rc == 0, err
    restart_dockerd(sandbox, name)
    try:
        yield name
    finally:
        cli("down", "-c", cfg)
        sandbox.run(name, "rm -f /etc/docker/daemon.json", user="root")
        restart_dockerd(sandbox, name)
        assert store_of(sandbox, name) == "classic"
        if was_serving:
            assert cli("up", "-c", cfg).exit_code == 0


def test_a_rank_switched_to_containerd_by_hand_is_shipped_and_served_again(sandbox, switched):
    cfg = str(sandbox.config)
    assert store_of(sandbox, switched) == "containerd"
    check = cli("check", "-c", cfg, "--json")
    rows = {c["name"]: c for c in json.loads(check.stdout)["ranks"][1]["checks"]}
    assert rows["docker"]["status"] == "pass" and "containerd image store (overlayfs snapshotter)" in rows["docker"]["value"]
    # the store switched: the images loaded before are hidden from it
    assert rows["image"]["status"] == "fail" and "missing on rank 1" in rows["image"]["value"]

    shipped = cli("ship", "-c", cfg, "--json")
    assert shipped.exit_code == 0, shipped.output
    ranks = json.loads(shipped.stdout)["ranks"]
    assert [r["status"] for r in ranks] == ["up-to-date", "shipped", "up-to-date", "up-to-date"], ranks
    assert ranks[1]["store"] == "containerd"
    [image] = ranks[1]["images"]
    built = cli("build", "-c", cfg, "--json")
    assert built.exit_code == 0
    local = json.loads(built.stdout)
    want = next(s["image_id"] for s in local["stages"] if s["tag"] == image)
    assert rank_config(sandbox, switched, image) == want  # the rank's own save: the same config
    again = cli("ship", "-c", cfg, "--json")
    assert [r["status"] for r in json.loads(again.stdout)["ranks"]] == ["up-to-date"] * 4  # a second ship moves nothing

    up = cli("up", "-c", cfg, "--no-verify")
    assert up.exit_code == 0, up.output
    check = cli("check", "-c", cfg, "--json")
    assert {c["name"]: c["status"] for c in json.loads(check.stdout)["ranks"][1]["checks"]}["image"] == "pass"
