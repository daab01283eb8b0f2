"""Shipping against the sandbox: real registry, real SSH forwards, each rank's own dockerd."""

import functools
import io
import json
import os
import shlex
import socket
import subprocess
import tarfile
import threading
import time
import uuid

import docker
import pytest
from click.testing import CliRunner

from launcher.inputs import config
from launcher.gather import ranks
from launcher.images import pushed, registry, relay, ship, spool
from launcher.images.local_docker import connect
from launcher.cli.commands import main

RUN_ID = uuid.uuid4().hex[:8]
# `spark`'s sshd session processes (pkill -f, an ERE): "sshd: spark..." up to OpenSSH 9 (Ubuntu
# 24.04's, DGX OS), "sshd-session: spark..." from OpenSSH 9.8 (Debian trixie's, the sandbox ranks')
SSH_SESSIONS = "^sshd(-session)?: spark"


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


# The config digest of the rank's image as the rank's own Docker saves it (index.json -> the
# manifest -> its config): the image's identity on either store (a containerd store's image ID is
# its manifest's digest), read without the kit.
RANK_CONFIG = r"""docker save {ref} | python3 -c '
import json, sys, tarfile
small = {{}}
with tarfile.open(fileobj=sys.stdin.buffer, mode="r|") as tar:
    for m in tar:
        if m.isfile() and m.size < 1 << 20:
            small[m.name] = tar.extractfile(m).read()
index = json.loads(small["index.json"])
digest = index["manifests"][0]["digest"]
manifest = json.loads(small["blobs/sha256/" + digest.split(":")[1]])
print(manifest["config"]["digest"])'"""


def rank_config(sandbox, name, ref):
    """The config digest of `ref` on the rank (None: the rank lacks it), whichever its store."""
    rc, out, _ = sandbox.run(name, RANK_CONFIG.format(ref=shlex.quote(ref)))
    return out.strip() if rc == 0 else None


def images_on_ranks(sandbox) -> dict[str, str]:
    """Every rank's images, tags and IDs: what a ship that moves nothing leaves as it was."""
    listing = "docker image ls --all --no-trunc --format '{{.Repository}}:{{.Tag}} {{.ID}}' | sort"
    return {n: sandbox.run(n, listing)[1] for n in sandbox.names}


def rank_clock(sandbox) -> str:
    return sandbox.run("spark1", "date +%s.%N")[1].strip()


def image_events_since(sandbox, since: str) -> dict[str, list[str]]:
    """The image events (pull, tag, untag, delete) each rank's dockerd logged since `since`."""
    command = (f"docker events --since {since} --until $(date +%s.%N) --filter type=image "
               "--format '{{.Action}} {{.Actor.ID}}'")
    return {n: sandbox.run(n, command)[1].split("\n")[:-1] for n in sandbox.names}


def leftover_tags(sandbox, name) -> list[str]:
    """The rank's temporary tags: a load's (`sparkstack-incoming:…`) or a registry pull's."""
    out = sandbox.run(name, "docker images --format '{{.Repository}}:{{.Tag}}'")[1].split()
    return [t for t in out if t.startswith(("sparkstack-incoming:", "127.0.0.1:"))]


def ship_refs(group, client, refs):
    plan = ranks.ship_plan(group, ship.local_image_ids(refs))
    return ship.apply(plan, group, say=lambda line: None)


@pytest.fixture
def own_registry(tmp_path, monkeypatch):
    """This host's registry and spool in tmp_path: what a ship pushes is this test's alone."""
    storage = tmp_path / "registry"
    monkeypatch.setattr(registry, "STORAGE", storage)
    monkeypatch.setattr(registry, "LocalRegistry", functools.partial(registry.LocalRegistry, storage=storage))
    monkeypatch.setattr(spool, "SPOOL", tmp_path / "spool")
    return storage


def test_ship_then_nothing_moves_and_only_the_top_layer_moves_next(sandbox, group, client, images, own_registry):
    base, top = images
    first = ship_refs(group, client, [base])
    assert [r.status for r in first.ranks] == ["shipped"] * 4, [r.error for r in first.ranks]
    want = client.images.get(base).id
    assert all(rank_config(sandbox, n, base) == want for n in sandbox.names)
    # no temporary tags (the load's) or registry-named leftovers on the ranks
    assert all(leftover_tags(sandbox, n) == [] for n in sandbox.names)

    since, before = rank_clock(sandbox), images_on_ranks(sandbox)
    again = ranks.ship_plan(group, ship.local_image_ids([base]))
    assert [r.status for r in again.ranks] == ["up-to-date"] * 4
    assert [r.bytes for r in ship.apply(again, group).ranks] == [0] * 4
    # a re-ship of what every rank has: no pull started, nothing tagged, nothing changed
    assert image_events_since(sandbox, since) == {n: [] for n in sandbox.names}
    assert images_on_ranks(sandbox) == before

    layer = client.images.get(top).history()[1]["Size"]  # the RUN layer (LABEL adds none)
    assert 1_900_000 < layer < 2_200_000
    # the base in this host's registry (as a first change over it leaves it): a change over it
    # is pushed, and only the change is read back
    base_id = client.images.get(base).id
    base_layers = connect().diff_ids(base_id)
    pushed.fill(registry.LocalRegistry(), base_id, base_layers, len(base_layers))
    second = ship_refs(group, client, [top])
    assert second.sources[top].how == "push", second.sources[top]
    for r in second.ranks:
        assert r.status == "shipped"
        # random bytes do not compress: the layer itself crossed, and little else
        assert 0.95 * layer <= r.bytes <= 1.1 * layer, f"rank {r.rank} moved {r.bytes} B for a {layer} B layer"


def build_scratch(client, name: str, payload_bytes: int, parent: str = "scratch") -> str:
    """An image FROM scratch (one layer of random bytes): no rank has any of it. Or that layer
    over `parent` (COPY: no shell needed in it)."""
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for member, data in ((f"payload-{name}", os.urandom(payload_bytes)),
                             ("Dockerfile", f"FROM {parent}\nCOPY payload-{name} /payload-{name}\n"
                                            f"LABEL org.sparkstack.test={RUN_ID}\n".encode())):
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    ref = f"sparkstack-test/ship:{name}-{RUN_ID}"
    client.images.build(fileobj=context, custom_context=True, tag=ref, rm=True)
    return ref


def test_an_image_no_rank_has_goes_to_every_rank_from_one_save(sandbox, group, client, tmp_path, monkeypatch):
    """Every rank lacks every layer: the one save streams to all four (each reading this host's
    tee at its own pace), nothing is kept here, and each rank gets exactly the save's bytes."""
    monkeypatch.setattr(spool, "SPOOL", tmp_path / "spool")
    ref = build_scratch(client, "scratch", 3_000_000)
    try:
        plan = ship_refs(group, client, [ref])
        assert [r.status for r in plan.ranks] == ["shipped"] * 4, [r.error for r in plan.ranks]
        save = sum(len(chunk) for chunk in client.images.get(ref).save())
        assert [r.bytes for r in plan.ranks] == [save] * 4
        want = client.images.get(ref).id
        assert all(rank_config(sandbox, n, ref) == want for n in sandbox.names)
        assert all(leftover_tags(sandbox, n) == [] for n in sandbox.names)
        # no layer kept, no tee left: only what names the image (its config, its layers' tar sizes
        # and the manifest the containerd rank took)
        kept = {p.name for p in (tmp_path / "spool").iterdir()}
        assert kept == {"images", "layer-sizes.json", "manifests"}, kept
        assert [p.name for p in (tmp_path / "spool" / "images").iterdir()] == [want[7:] + ".json"]
    finally:
        client.images.remove(ref, force=True)
        for name in sandbox.names:
            sandbox.run(name, f"docker rmi -f {ref} >/dev/null 2>&1; true")


def test_a_rank_without_docker_fails_alone_and_reship_completes(sandbox, group, client, images):
    _, top = images
    extra = build_on(client, top, "v3", 300_000)
    victim = "sparkstack-spark3"
    try:
        c = client.containers.get(victim)
        c.exec_run("pkill -x dockerd")
        deadline = time.monotonic() + 60
        while c.exec_run("docker info").exit_code == 0:
            assert time.monotonic() < deadline, f"dockerd in {victim} still answers 60 s after pkill"
            time.sleep(0.2)
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
    assert rank_config(sandbox, "spark3", extra) == client.images.get(extra).id
    client.images.remove(extra, force=True)
    for name in sandbox.names:
        sandbox.run(name, f"docker rmi -f {extra} >/dev/null 2>&1; true")


def _restart_dockerd(client, container: str) -> None:
    """Start the rank's engine as its init does, once the killed one has finished shutting down:
    its API closes before its cleanup ends, and a second dockerd refuses a live pid file."""
    c = client.containers.get(container)
    deadline = time.monotonic() + 60
    while c.exec_run("pgrep -x dockerd").exit_code == 0:
        assert time.monotonic() < deadline, f"the killed dockerd in {container} still runs after 60 s"
        time.sleep(0.2)
    c.exec_run("sh -c '/usr/local/sbin/sandbox-dockerd &'", detach=True)
    deadline = time.monotonic() + 60
    while c.exec_run("docker info").exit_code != 0:
        if time.monotonic() > deadline:
            log = c.exec_run("tail -n 20 /var/log/dockerd.log").output.decode(errors="replace")
            raise AssertionError(f"dockerd did not come back in {container} in 60 s:\n{log}")
        time.sleep(0.2)


# --- faults mid-ship: the victim fails alone, named, untagged; a re-ship completes ------------

def throttle(client, container: str, rate: str = "40mbit"):
    """Slow what reaches the rank (the host end of its veth, tbf): a 24 MB layer then takes ~5 s,
    so a fault can land mid-transfer. Returns the undo."""
    # the interface of the default route: eth0, or eth1 after a disconnect and reconnect
    idx = client.containers.get(container).exec_run(
        ["sh", "-c", "cat /sys/class/net/$(ip -o -4 route show default | awk '{print $5}')/iflink"]
    ).output.decode().strip()
    dev = next(line.split(": ")[1].split("@")[0] for line in subprocess.run(
        ["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout.splitlines()
        if line.split(": ")[0] == idx)
    subprocess.run(["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", "64kb",
                    "latency", "400ms"], check=True)
    return lambda: subprocess.run(["tc", "qdisc", "del", "dev", dev, "root"], capture_output=True)


def ship_with_fault(group, client, ref, victim: str, fault, after_s: float = 1.0):
    """Ship `ref` to every rank; once the victim's `docker load` has run `after_s`, do `fault`."""
    result = {}
    worker = threading.Thread(target=lambda: result.update(plan=ship_refs(group, client, [ref])))
    c = client.containers.get(victim)
    worker.start()
    deadline = time.monotonic() + 120
    while c.exec_run("pgrep -f 'docker load'").exit_code != 0:
        assert time.monotonic() < deadline and worker.is_alive(), "the victim never started loading"
        time.sleep(0.1)
    time.sleep(after_s)
    fault(c)
    worker.join(timeout=300)
    assert not worker.is_alive(), "ship did not end after the fault"
    return {r.rank: r for r in result["plan"].ranks}


def reship_completes(sandbox, group, client, ref, victim_rank: int, layer: int):
    """After the fault is cleared: only the victim moves, and no more than the layer (x1.1)."""
    plan = ship_refs(group, client, [ref])
    assert [r.status for r in plan.ranks] == ["shipped" if r.rank == victim_rank else "up-to-date"
                                              for r in plan.ranks], [r.error for r in plan.ranks]
    moved = plan.ranks[victim_rank].bytes
    assert moved <= 1.1 * layer + 200_000, f"re-ship moved {moved} B for a {layer} B layer"
    assert rank_config(sandbox, sandbox.names[victim_rank], ref) == client.images.get(ref).id
    assert leftover_tags(sandbox, sandbox.names[victim_rank]) == []


@pytest.fixture
def big(sandbox, client, images):
    """A fresh 24 MB random layer over the shipped base: the thing in flight when faults land."""
    ref = build_on(client, images[0], f"big{uuid.uuid4().hex[:4]}", 24_000_000)
    layer = client.images.get(ref).history()[0]["Size"] or client.images.get(ref).history()[1]["Size"]
    base_plan = ship_refs(group_of(sandbox), client, [images[0]])  # every rank has the base
    assert all(r.status != "failed" for r in base_plan.ranks)
    yield ref, layer
    client.images.remove(ref, force=True)
    for name in sandbox.names:
        sandbox.run(name, f"docker rmi -f {ref} >/dev/null 2>&1; true")


def group_of(sandbox, dead_after: float = 30):
    from launcher.transport.remote import Group

    return Group.for_cluster(config.load(sandbox.config).cluster, attempts=1, dead_after=dead_after,
                             say=lambda line: None)


def test_sshd_killed_mid_ship(sandbox, client, big):
    ref, layer = big
    undo = throttle(client, "sparkstack-spark2")
    try:
        with group_of(sandbox) as group:
            # the rank's sshd sessions die (the listener stays, as after `systemctl restart ssh`)
            by_rank = ship_with_fault(group, client, ref, "sparkstack-spark2",
                                      lambda c: c.exec_run(["pkill", "-f", SSH_SESSIONS]))
    finally:
        undo()
    assert [by_rank[i].status for i in (0, 2, 3)] == ["shipped"] * 3
    assert by_rank[1].status == "failed" and by_rank[1].error.startswith("rank 1 (spark2): connection lost")
    assert "re-run when the rank is back" in by_rank[1].error
    assert rank_image_id(sandbox, "spark2", ref) is None  # no partial tag
    assert leftover_tags(sandbox, "spark2") == []
    with group_of(sandbox) as group:
        reship_completes(sandbox, group, client, ref, 1, layer)


def test_sshd_killed_mid_ship_of_an_image_no_rank_has(sandbox, client, tmp_path, monkeypatch):
    """The ranks read one save as it streams (spool.Tee): the victim's end frees nothing the
    others need; they finish, it fails alone, untagged, and a re-ship moves only its image."""
    monkeypatch.setattr(spool, "SPOOL", tmp_path / "spool")
    ref = build_scratch(client, f"scratchbig{uuid.uuid4().hex[:4]}", 24_000_000)
    layer = client.images.get(ref).history()[0]["Size"] or client.images.get(ref).history()[1]["Size"]
    undo = throttle(client, "sparkstack-spark2")
    try:
        with group_of(sandbox) as group:
            by_rank = ship_with_fault(group, client, ref, "sparkstack-spark2",
                                      lambda c: c.exec_run(["pkill", "-f", SSH_SESSIONS]))
        undo()
        assert [by_rank[i].status for i in (0, 2, 3)] == ["shipped"] * 3, [r.error for r in by_rank.values()]
        assert by_rank[1].status == "failed" and by_rank[1].error.startswith("rank 1 (spark2): connection lost")
        assert rank_image_id(sandbox, "spark2", ref) is None
        assert leftover_tags(sandbox, "spark2") == []
        with group_of(sandbox) as group:
            reship_completes(sandbox, group, client, ref, 1, layer)
    finally:
        undo()
        client.images.remove(ref, force=True)
        for name in sandbox.names:
            sandbox.run(name, f"docker rmi -f {ref} >/dev/null 2>&1; true")


def cut_off(address: str):
    """The rank vanishes from this host's view (no FIN, no RST): every packet to or from it dropped
    here. Returns the undo. (Not `docker network disconnect`: an endpoint connected again comes back
    under another name, and the next disconnect, looking for it by its old one, leaves it in place.)"""
    rules = [["OUTPUT", "-d", address, "-j", "DROP"], ["INPUT", "-s", address, "-j", "DROP"]]
    for rule in rules:
        subprocess.run(["iptables", "-I", *rule], check=True)
    return lambda: [subprocess.run(["iptables", "-D", *rule], capture_output=True) for rule in rules]


def test_network_cut_mid_ship(sandbox, client, big):
    """The rank vanishes from the network (no FIN, no RST): declared lost after dead_after_s."""
    ref, layer = big
    victim, address = "sparkstack-spark3", sandbox.rank("spark3")["address"]
    undo, cuts = throttle(client, victim), []
    started = time.monotonic()
    try:
        with group_of(sandbox, dead_after=6) as group:
            by_rank = ship_with_fault(group, client, ref, victim, lambda c: cuts.append(cut_off(address)))
        took = time.monotonic() - started
    finally:
        undo()
        for mend in cuts:
            mend()
    assert [by_rank[i].status for i in (0, 1, 3)] == ["shipped"] * 3
    assert by_rank[2].status == "failed" and by_rank[2].error.startswith("rank 2 (spark3): connection lost")
    assert took < 60, f"the cut took {took:.0f} s to notice"
    assert rank_image_id(sandbox, "spark3", ref) is None
    assert leftover_tags(sandbox, "spark3") == []
    with group_of(sandbox) as group:
        reship_completes(sandbox, group, client, ref, 2, layer)


def test_disk_full_mid_ship(sandbox, client, big):
    """`docker load` unpacks into <root>/tmp first: a 4 MB filesystem there fills mid-layer."""
    ref, layer = big
    # a rank on the classic store (overlay2): its `docker load` unpacks into <root>/tmp
    victim = client.containers.get("sparkstack-spark3")
    assert victim.exec_run("mount -t tmpfs -o size=4m sandbox-full /var/lib/docker/tmp").exit_code == 0
    try:
        with group_of(sandbox) as group:
            plan = ship_refs(group, client, [ref])
    finally:
        victim.exec_run("umount /var/lib/docker/tmp")
    by_rank = {r.rank: r for r in plan.ranks}
    assert [by_rank[i].status for i in (0, 1, 3)] == ["shipped"] * 3
    assert by_rank[2].status == "failed" and by_rank[2].error.startswith("rank 2 (spark3): disk full")
    assert "docker image prune, or grow the disk" in by_rank[2].error
    assert rank_image_id(sandbox, "spark3", ref) is None
    assert leftover_tags(sandbox, "spark3") == []
    with group_of(sandbox) as group:
        reship_completes(sandbox, group, client, ref, 2, layer)


# --- relay: the uplink carries each blob once ------------------------------------------------

def test_relay_uplink_carries_the_layer_for_all_ranks(sandbox, client, images):
    """`ship --relay`: every rank pulls from rank 0's registry cache; only rank 0's SSH connection
    carries the new layer, the others' carry nothing; every rank ends with the right ID."""
    # A fresh base, shipped through the relay too: a layer that came by `docker load` (a plain
    # ship) has no registry digest on the rank, so a rank's first registry pull over it moves it again.
    route = relay.route(config.load(sandbox.config))
    base = build_on(client, sandbox.images["vllm"], f"relaybase{uuid.uuid4().hex[:4]}", 200_000)
    ref = build_on(client, base, f"relay{uuid.uuid4().hex[:4]}", 3_000_000)
    layer = client.images.get(ref).history()[1]["Size"]
    try:
        with group_of(sandbox) as group:
            first = ship.apply(ranks.ship_plan(group, ship.local_image_ids([base])), group, say=lambda line: None,
                               relay=route)
            assert all(r.status != "failed" for r in first.ranks)
            plan = ranks.ship_plan(group, ship.local_image_ids([ref]))
            lines = []
            ship.apply(plan, group, say=lines.append, relay=route)
        assert [r.status for r in plan.ranks] == ["shipped"] * 4, [r.error for r in plan.ranks]
        uplink = plan.ranks[0].bytes
        # twice, whatever the rank count: distribution's proxy fetches a blob once to stream it to
        # the first puller and once to store it (without the relay: once per rank, here 4x)
        assert 1.9 * layer <= uplink <= 2.1 * layer + 100_000, f"{uplink} B over the uplink for a {layer} B layer"
        assert [r.bytes for r in plan.ranks[1:3]] == [0, 0]
        # spark4, on containerd's image store (the sandbox's default mixed fleet), pulls from no
        # plain-HTTP loopback registry: it gets the layer from this host, and only the layer
        assert plan.ranks[3].store == "containerd" and layer <= plan.ranks[3].bytes <= 1.1 * layer + 100_000
        assert "relay: rank 3 on containerd's image store, which pulls from no plain-HTTP loopback registry: " \
               "sent the layers it lacks from this host instead" in lines
        assert any(line.startswith("relay: rank 0's cache at 172.31.240.11:") for line in lines)
        want = client.images.get(ref).id
        assert all(rank_config(sandbox, n, ref) == want for n in sandbox.names)
        # the cache is gone with its storage
        assert relay_left_on(sandbox) == ""
    finally:
        client.images.remove(ref, force=True)
        client.images.remove(base, force=True)
        for name in sandbox.names:
            sandbox.run(name, f"docker rmi -f {ref} {base} >/dev/null 2>&1; true")


def relay_left_on(sandbox) -> str:
    """What of a relay runs or lies on rank 0: its directory, the cache, the gate (the brackets
    keep this command's own line from matching)."""
    return sandbox.run("spark1", "ls -d /tmp/sparkstack-rela[y].* 2>/dev/null; pgrep -x docker-registry; "
                                 "pgrep -f '[s]parkstack-relay'; true")[1].strip()


STATUS_ON_RANK = """
import sys, urllib.error, urllib.request
for url in sys.argv[1:]:
    accept = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
    try:
        print(urllib.request.urlopen(urllib.request.Request(url, headers={"Accept": accept}), timeout=10).status)
    except urllib.error.HTTPError as e:
        print(e.code)
"""


def test_relay_gate_serves_only_this_ships_images_and_only_to_the_ranks(sandbox, client, images):
    """The cache on rank 0 behind its gate, shipping `base` only: a rank reads base's manifest
    and blobs; not `top`'s layer (this host's registry holds it), nor the catalog; this host,
    which is not a rank, is cut off at once. Stopped, nothing is left."""
    from launcher.images.registry import LocalRegistry

    base, top = images
    route = relay.route(config.load(sandbox.config))
    with LocalRegistry() as registry, group_of(sandbox) as group:
        for ref in (base, top):
            registry.push(ref)
        repo, manifests, blobs = registry.contents(base)
        top_layer = sorted(set(registry.contents(top)[2]) - set(blobs))[0]
        head = group.connections[0]
        front = relay.UpstreamFront(registry.port)
        upstream, _ = head.reverse_forward(front.port)
        cache = relay.start(head, relay.gate_spec(route, [(repo, manifests, blobs)]), upstream, front.password)
        try:
            url = f"http://{cache.address}:{cache.port}/v2/"
            wanted = [url, f"{url}{repo}/manifests/{manifests[0]}", f"{url}{repo}/blobs/{blobs[0]}",
                      f"{url}{repo}/blobs/{top_layer}", f"{url}_catalog"]
            rc, out, err = sandbox.run("spark3", shlex.join(["python3", "-c", STATUS_ON_RANK, *wanted]))
            assert rc == 0, err
            assert out.split() == ["200", "200", "200", "403", "403"]
            with socket.create_connection((cache.address, cache.port), timeout=10) as s:
                s.sendall(b"GET /v2/ HTTP/1.1\r\nHost: x\r\n\r\n")
                try:
                    assert s.recv(1024) == b""  # closed before a word
                except ConnectionResetError:
                    pass
        finally:
            relay.stop(head, cache)
            head.cancel_forward(upstream)
            front.close()
    assert relay_left_on(sandbox) == ""


# Run on rank 0 as another local user while a relayed ship runs: what rank 0's loopback gives them.
# argv: the cache's listen address (host:port, or a socket path), the upstream forward's port,
# the repository, a manifest reference.
MALLORY_ON_RANK_0 = """
import json, socket, sys, urllib.error, urllib.request
cache, upstream, repo, ref = sys.argv[1:5]
accept = "application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json"
def status(url, method="GET"):
    try:
        return urllib.request.urlopen(urllib.request.Request(url, method=method, headers={"Accept": accept}),
                                      timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError as e:
        return type(e).__name__
got = {"upstream read": status("http://127.0.0.1:%s/v2/%s/manifests/%s" % (upstream, repo, ref)),
       "upstream push": status("http://127.0.0.1:%s/v2/%s/blobs/uploads/" % (upstream, repo), "POST")}
if cache.startswith("/"):
    try:
        socket.socket(socket.AF_UNIX).connect(cache)
        got["cache read"] = "connected"
    except OSError as e:
        got["cache read"] = type(e).__name__
else:
    got["cache read"] = status("http://%s/v2/%s/manifests/%s" % (cache, repo, ref))
print(json.dumps(got))
"""


def test_another_user_on_rank_0_can_neither_read_nor_push_through_the_relay(sandbox, client, images):
    """Issue 33: while the relay runs, a second local user on rank 0 tries its loopback: the
    cache, and the reverse forward to this host's registry (which holds every image shipped)."""
    from launcher.images.registry import LocalRegistry

    route = relay.route(config.load(sandbox.config))
    ref = build_on(client, sandbox.images["vllm"], f"mallory{uuid.uuid4().hex[:4]}", 100_000)
    rank0 = "sparkstack-spark1"
    subprocess.run(["docker", "exec", rank0, "useradd", "-m", "mallory"], check=True, capture_output=True)
    found = {}

    def attack(ranks, cache) -> None:  # in the pulls' place: the cache and the forward are up
        config_yml = subprocess.run(["docker", "exec", rank0, "sh", "-c", f"cat {cache.directory}/config.yml"],
                                    capture_output=True, text=True, check=True).stdout
        listen = config_yml.split('addr: "')[1].split('"')[0]
        upstream = config_yml.split("remoteurl: \"http://127.0.0.1:")[1].split('"')[0]
        repo, manifests, _blobs = registry.contents(ref)
        done = subprocess.run(["docker", "exec", "-u", "mallory", rank0, "python3", "-c", MALLORY_ON_RANK_0,
                               listen, upstream, repo, manifests[0]], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        found.update(json.loads(done.stdout))

    try:
        with group_of(sandbox) as group, LocalRegistry() as registry:
            plan = ranks.ship_plan(group, ship.local_image_ids([ref]))
            registry.push(ref)
            todo = [r for r in plan.ranks if r.status == "planned"]
            ship._apply_relayed(plan, {c.target.rank: c for c in group.connections}, registry, route, todo,
                                attack, lambda line: None)
        assert found["upstream read"] == 401, found  # this host's registry: not without the ship's secret
        assert found["upstream push"] in (401, 501), found
        assert found["cache read"] == "PermissionError", found  # a socket in the relay's 0700 directory
        assert relay_left_on(sandbox) == ""
    finally:
        subprocess.run(["docker", "exec", rank0, "sh", "-c", "pkill -u mallory; userdel -r -f mallory"],
                       capture_output=True)
        client.images.remove(ref, force=True)


def test_relay_without_a_registry_on_rank_0_says_so(sandbox, client, images):
    base, _ = images
    ref = build_on(client, base, f"norelay{uuid.uuid4().hex[:4]}", 100_000)
    hide = "sudo mv /usr/bin/docker-registry /usr/bin/docker-registry.hidden"
    assert sandbox.run("spark1", hide)[0] == 0
    try:
        result = CliRunner().invoke(main, ["ship", "-c", str(sandbox.config), "--image", ref, "--relay"])
        assert result.exit_code == 1
        assert "rank 0 (spark1): cannot start the relay cache" in result.output
        assert "install it (apt install docker-registry), or ship without --relay" in result.output
        assert all(rank_image_id(sandbox, n, ref) is None for n in sandbox.names[:3])
        # spark4 (containerd's image store) takes no relayed pull: it got the layer from this host
        assert rank_config(sandbox, "spark4", ref) == client.images.get(ref).id
    finally:
        sandbox.run("spark1", "sudo mv /usr/bin/docker-registry.hidden /usr/bin/docker-registry")
        sandbox.run("spark4", f"docker rmi -f {ref} >/dev/null 2>&1; true")
        client.images.remove(ref, force=True)


def test_cli_json_and_dry_run(sandbox, group, client, images, own_registry):
    """`ship --dry-run --json`: per rank, what it lacks (an image every rank has is not listed);
    nothing moves, no pull starts, nothing on the ranks changes."""
    base, _ = images
    assert all(r.status != "failed" for r in ship_refs(group, client, [base]).ranks)  # every rank has base
    fresh = build_on(client, base, f"dry{uuid.uuid4().hex[:4]}", 100_000)  # no rank has it
    try:
        since, before = rank_clock(sandbox), images_on_ranks(sandbox)
        result = CliRunner().invoke(main, ["ship", "-c", str(sandbox.config), "--image", base, "--image", fresh,
                                           "--dry-run", "--json"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        hosts = [sandbox.rank(n)["address"] for n in sandbox.names]
        sources = data.pop("sources")
        stores = ["classic", "classic", "classic", "containerd"]  # the sandbox's default: mixed
        hows = [f"{fresh}: the 1 of {len(client.images.get(fresh).attrs['RootFS']['Layers'])} layers it lacks, "
                "config and manifest (" + ("an OCI layout" if s == "containerd" else "a save-format tar")
                for s in stores]
        got = [(r.pop("store"), r.pop("how")) for r in data["ranks"]]
        assert [g[0] for g in got] == stores
        assert [g[1][:len(h)] for g, h in zip(got, hows)] == hows
        assert data == {"ranks": [{"rank": i, "host": hosts[i], "images": [fresh], "bytes": 0, "missing": 0, "seconds": 0.0,
                                   "status": "planned", "error": None} for i in range(4)]}
        # the ranks hold its base: the choice between saving the whole image and pushing, with
        # its numbers; nothing pushed for a dry run
        assert [(s["ref"], s["how"] in ("push", "save")) for s in sources] == [(fresh, True)], sources
        assert "the ranks lack" in sources[0]["why"] and sources[0]["seconds"] > 0
        assert not own_registry.exists()
        assert image_events_since(sandbox, since) == {n: [] for n in sandbox.names}
        assert images_on_ranks(sandbox) == before
        assert all(rank_image_id(sandbox, n, fresh) is None for n in sandbox.names)
    finally:
        client.images.remove(fresh, force=True)
        for name in sandbox.names:  # shipped only by a broken dry run
            sandbox.run(name, f"docker rmi -f {fresh} >/dev/null 2>&1; true")


def test_missing_local_image_is_a_clear_error(sandbox):
    result = CliRunner().invoke(main, ["ship", "-c", str(sandbox.config), "--image", "no/such:image"])
    assert result.exit_code == 1
    assert "image no/such:image is not on this host: run `sparkstack build`" in result.output
