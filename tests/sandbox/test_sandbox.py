"""The sandbox cluster, checked on the real thing: ssh with verified host keys, a Docker image
store per rank, the shared checkpoint, the per-rank fabric fixtures, idempotent `up`, the CLI.

The tests that need the running sandbox use the session fixture `sandbox` (tests/sandbox_fixture.py).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import paramiko
import pytest
import yaml

from launcher.sandbox import cluster, debian_image, fabric_fixture as fabric, links
from launcher.sandbox.errors import SandboxError

ROOT = Path(__file__).resolve().parents[2]

# Tests that kill or restart ranks; skip them while other sessions share the same sandbox.
restarts_ranks = pytest.mark.skipif(os.environ.get("SPARKSTACK_SANDBOX_NO_RESTART") == "1",
                                    reason="SPARKSTACK_SANDBOX_NO_RESTART=1")


def sparkstack(*args, env=None, timeout=300):
    """Run the real console script (falls back to the module when not installed)."""
    exe = Path(sys.executable).with_name("sparkstack")
    cmd = [str(exe), *args] if exe.exists() else [sys.executable, "-c",
                                                  "from launcher.cli.commands import main; main()", *args]
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, env=full_env, timeout=timeout, cwd=ROOT)


# ---------------------------------------------------------------------------------------------
# Pure parts (no Docker)


def test_fabric_ring_is_consistent():
    for r in range(4):
        t = fabric.fabric_truth(r)
        for port in t["ports"]:
            peer = fabric.fabric_truth(port["peer_rank"])
            back = next(p for p in peer["ports"] if p["peer_rank"] == r)
            net = ipaddress.IPv4Network(port["subnet"])
            assert port["subnet"] == back["subnet"]
            assert ipaddress.IPv4Address(port["ip"]) in net
            assert ipaddress.IPv4Address(back["ip"]) in net
            assert port["ip"] != back["ip"]
    # rank 0 and rank 2 are not neighbours in a ring
    assert 2 not in [p["peer_rank"] for p in fabric.fabric_truth(0)["ports"]]


def test_ring_cables_join_each_port0_to_the_next_ranks_port1():
    for n in (2, 4, 16):
        cables = links.cables(n)
        assert len(cables) == n
        for c in cables:
            assert (c.a.rank, c.b.rank) == (c.link, (c.link + 1) % n)
            assert (c.a.netdev, c.b.netdev) == ("enp1s0f0np0", "enp1s0f1np1")
            # the two ends hold the two hosts of the link's /30, as the fixtures say
            net = ipaddress.IPv4Network(c.a.ip, strict=False)
            assert net.prefixlen == 30 and ipaddress.IPv4Interface(c.b.ip).network == net
            assert c.a.ip.split("/")[0] == fabric.port_ip(c.a.rank, 0, n)
            assert c.b.ip.split("/")[0] == fabric.port_ip(c.b.rank, 1, n)
            assert net.subnet_of(ipaddress.IPv4Network(links.FABRIC_NET))
        ends = [(e.rank, e.netdev) for c in cables for e in (c.a, c.b)]
        assert len(set(ends)) == 2 * n  # every port of every rank cabled once


def test_rank_count_is_bounded(monkeypatch):
    monkeypatch.delenv("SPARKSTACK_SANDBOX_RANKS", raising=False)
    assert cluster.n_ranks() == 4 and cluster.n_ranks(16) == 16
    monkeypatch.setenv("SPARKSTACK_SANDBOX_RANKS", "8")
    assert cluster.n_ranks() == 8
    for bad in (1, 33):
        with pytest.raises(SandboxError, match="ranks is not possible"):
            cluster.n_ranks(bad)
    monkeypatch.setenv("SPARKSTACK_SANDBOX_RANKS", "many")
    with pytest.raises(SandboxError, match="'many' ranks"):
        cluster.n_ranks()


def test_fabric_truth_differs_per_rank_as_specified():
    truths = [fabric.fabric_truth(r) for r in range(4)]
    assert truths[2]["fabric_port"] == 1 and truths[2]["netdev"] == "enp1s0f1np1"
    assert truths[2]["hca_twins"] == ["rocep1s0f1", "roceP2p1s0f1"]
    assert all(t["fabric_port"] == 0 for i, t in enumerate(truths) if i != 2)
    assert len({t["gid_index"] for t in truths}) > 1
    assert len({t["fabric_ip"] for t in truths}) == 4


def test_sysfs_tree_gid_table_real_format():
    for r in range(4):
        files = fabric.sysfs_tree(r)
        t = fabric.fabric_truth(r)
        port = f"class/infiniband/{t['hca']}/ports/1"
        assert files[f"{port}/gids/{t['gid_index']}"].strip() == t["gid"]
        assert files[f"{port}/gid_attrs/types/{t['gid_index']}"] == "RoCE v2\n"
        assert files[f"{port}/gids/1"].startswith("fe80:0000:0000:0000:")
        assert files[f"{port}/gid_attrs/types/1"] == "RoCE v2\n"
        assert files[f"{port}/gid_attrs/types/0"] == "IB/RoCE v1\n"
        assert files[f"{port}/state"] == "4: ACTIVE\n"
        assert files[f"{port}/link_layer"] == "Ethernet\n"
        assert f"class/infiniband/{t['hca']}/device/net/{t['netdev']}/mtu" in files
        for nd in ("enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1", "enP7s7"):
            assert files[f"class/net/{nd}/operstate"] == "up\n"
        assert files["class/net/enp1s0f0np0/speed"] == "200000\n"
        assert files["class/net/enP7s7/speed"] == "10000\n"
        ip = ipaddress.IPv4Address(t["fabric_ip"]).packed
        assert t["gid"].endswith(f"ffff:{ip[0]:02x}{ip[1]:02x}:{ip[2]:02x}{ip[3]:02x}")


def test_image_tags_are_content_hashes():
    a = debian_image.RootfsRecipe("x", ("python3", "curl"))
    b = debian_image.RootfsRecipe("x", ("curl", "python3"))
    c = debian_image.RootfsRecipe("x", ("curl", "python3", "less"))
    assert a.tag == b.tag != c.tag
    assert debian_image.rank_stage().tag == debian_image.rank_stage().tag


def test_no_disk_space_is_one_clear_message(tmp_path):
    with pytest.raises(SandboxError) as e:
        debian_image.check_free_space(tmp_path, need=1 << 60)
    assert "not enough disk space" in e.value.message and "fix:" in e.value.message


def test_engine_unreachable_is_one_clear_message(tmp_path):
    res = sparkstack("sandbox", "status", env={"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock"})
    assert res.returncode != 0
    assert "local Docker engine does not answer at unix://" in res.stderr and "fix:" in res.stderr
    assert "Traceback" not in res.stderr + res.stdout


# ---------------------------------------------------------------------------------------------
# The running sandbox


def test_ssh_verifies_real_host_keys(sandbox):
    for name in sandbox.names:
        code, out, _ = sandbox.run(name, "hostname; id -un; sudo -n id -u")
        assert code == 0
        assert out.split() == [name, sandbox.rank(name)["user"], "0"]
    # root accepts the same key
    code, out, _ = sandbox.run("spark2", "id -u", user="root")
    assert (code, out.strip()) == (0, "0")


def test_wrong_host_key_is_rejected(sandbox, tmp_path):
    # a known_hosts that names spark1's address with spark2's key must make the connection fail
    lines = sandbox.known_hosts.read_text().splitlines()
    spark1_addr = sandbox.rank("spark1")["address"]
    spark2_key = next(l for l in lines if l.split()[0].endswith(",spark2")).split(None, 1)[1]
    bad = tmp_path / "known_hosts"
    bad.write_text(f"{spark1_addr} {spark2_key}\n")
    cli = paramiko.SSHClient()
    cli.load_host_keys(str(bad))
    cli.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.BadHostKeyException):
        cli.connect(spark1_addr, username="spark", key_filename=str(sandbox.key),
                    look_for_keys=False, allow_agent=False, timeout=10)
    cli.close()
    # and an empty known_hosts (unknown host) is refused, not trusted silently
    cli = paramiko.SSHClient()
    cli.set_missing_host_key_policy(paramiko.RejectPolicy())
    with pytest.raises(paramiko.SSHException):
        cli.connect(spark1_addr, username="spark", key_filename=str(sandbox.key),
                    look_for_keys=False, allow_agent=False, timeout=10)
    cli.close()


def test_each_rank_has_its_own_image_store(sandbox):
    base = sandbox.images["vllm"]
    for name in sandbox.names:
        code, out, _ = sandbox.run(name, "docker images --format '{{.Repository}}:{{.Tag}}'")
        assert code == 0 and base in out.split()
        code, out, _ = sandbox.run(name, "docker info --format '{{.Driver}}'")
        # overlayfs: containerd's snapshotter (spark4's Docker keeps images in containerd's store)
        assert out.strip() in ("overlay2", "vfs", "fuse-overlayfs", "overlayfs")
    tag = f"sandbox-probe:{uuid.uuid4().hex[:8]}"
    code, out, err = sandbox.run("spark1", f"tar -cf - -T /dev/null | docker import - {tag}")
    assert code == 0, err
    try:
        assert sandbox.run("spark1", f"docker image inspect {tag}")[0] == 0
        for other in sandbox.names[1:]:
            assert sandbox.run(other, f"docker image inspect {tag}")[0] != 0, other
        import docker

        with pytest.raises(docker.errors.ImageNotFound):
            docker.from_env().images.get(tag)
    finally:
        sandbox.run("spark1", f"docker rmi {tag}")


def test_stand_in_engine_runs_in_a_rank(sandbox):
    base = sandbox.images["vllm"]
    code, out, err = sandbox.run(
        "spark3", f"docker run --rm --network host -v /models/glm53-sandbox:/models/glm53-sandbox:ro "
                  f"{base} vllm --version")
    assert code == 0, err
    assert out.strip()
    code, out, _ = sandbox.run("spark3", f"docker image inspect {base} --format "
                                         "'{{index .Config.Labels \"org.sparkstack.standin\"}}'")
    assert out.strip() == "vllm"


def test_checkpoint_same_bytes_on_every_rank(sandbox):
    host_dir = cluster.paths(sandbox.state_dir)["model"]
    expected = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(host_dir.iterdir()) if p.is_file()}
    assert {"config.json", "model.safetensors.index.json"} <= set(expected)
    assert sum(1 for n in expected if n.endswith(".safetensors")) >= 2
    for name in sandbox.names:
        code, out, err = sandbox.run(name, f"cd {cluster.MODEL_PATH} && sha256sum *")
        assert code == 0, err
        got = {line.split()[1]: line.split()[0] for line in out.splitlines()}
        assert got == expected, name
    cfg = json.loads((host_dir / "config.json").read_text())
    assert cfg["model_type"] == "glm_moe_dsa" and cfg["architectures"] == ["GlmMoeDsaForCausalLM"]
    from launcher.facts.safetensors_header import read_header

    index = json.loads((host_dir / "model.safetensors.index.json").read_text())
    for tensor, shard in index["weight_map"].items():
        assert tensor in read_header(host_dir / shard)
    kv_a = "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    hdr = read_header(host_dir / index["weight_map"][kv_a])
    assert hdr[kv_a]["shape"] == [cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], cfg["hidden_size"]]


def test_sysfs_fixtures_over_ssh_differ_per_rank(sandbox):
    seen_gid_index = set()
    for name in sandbox.names:
        t = sandbox.truth[name]
        root = sandbox.rank(name).get("sysfs_root", cluster.SYSFS_ROOT)
        port = f"{root}/class/infiniband/{t['hca']}/ports/1"
        code, out, err = sandbox.run(
            name, f"cat {port}/gids/{t['gid_index']} {port}/gid_attrs/types/{t['gid_index']} "
                  f"{port}/state {root}/class/net/{t['netdev']}/mtu; ls {root}/class/infiniband/"
                  f"{t['hca']}/device/net/")
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0] == t["gid"]
        assert lines[1] == "RoCE v2"
        assert lines[2] == "4: ACTIVE"
        assert lines[3] == "9000"
        assert lines[4] == t["netdev"]
        seen_gid_index.add(t["gid_index"])
        # the fixtures are read-only for the rank
        assert sandbox.run(name, f"sudo -n sh -c 'echo x > {port}/state'")[0] != 0
    assert len(seen_gid_index) > 1
    assert sandbox.truth["spark3"]["netdev"] == "enp1s0f1np1"


def test_cluster_yaml_describes_the_sandbox(sandbox):
    doc = yaml.safe_load(sandbox.config.read_text())
    assert doc["profile"] == "sandbox" and doc["topology"] == "ring"
    assert doc["ssh"]["known_hosts"] == str(sandbox.known_hosts)
    assert doc["model"]["path"] == cluster.MODEL_PATH
    assert doc["images"]["base"] == sandbox.images["vllm"]
    patches = Path(doc["images"]["patches_dir"])
    assert {"exl3.py", "sm120_dcp.py", "mla_attn_dcp.py", "sparse_attn_indexer.py"} <= {
        p.name for p in patches.iterdir()}
    for rank, status in zip(doc["ranks"], sandbox.ranks):
        assert rank["address"] == status["address"] and rank["user"] == status["user"]
        assert [str(ip) for ip in rank["fabric_ips"]] == [sandbox.truth[rank["name"]]["fabric_ip"]]
        assert rank["sysfs_root"] == cluster.SYSFS_ROOT
    try:
        from launcher.inputs import config as config_mod
    except ImportError:
        return
    loaded = config_mod.load(sandbox.config)
    assert [r.name for r in loaded.cluster.ranks] == sandbox.names


def test_per_rank_sysctls_do_not_touch_the_host(sandbox):
    host_before = Path("/proc/sys/vm/swappiness").read_text().strip()
    spark1_before = sandbox.run("spark1", "cat /proc/sys/vm/swappiness")[1].strip()
    spark4_before = sandbox.run("spark4", "cat /proc/sys/vm/swappiness")[1].strip()
    try:
        code, out, err = sandbox.run("spark4", "sudo -n sysctl -w vm.swappiness=7 >/dev/null && "
                                               "cat /proc/sys/vm/swappiness")
        assert code == 0, err
        assert out.strip() == "7"
        assert Path("/proc/sys/vm/swappiness").read_text().strip() == host_before
        # the other ranks keep their own value
        assert sandbox.run("spark1", "cat /proc/sys/vm/swappiness")[1].strip() == spark1_before
        # and an unprivileged write fails as on a real box
        assert sandbox.run("spark4", "echo 5 > /proc/sys/vm/swappiness")[0] != 0
    finally:
        sandbox.run("spark4", f"sudo -n sysctl -w vm.swappiness={spark4_before}")


def test_up_again_is_idempotent_and_fast(sandbox):
    ids_before = {c.name: c.id for c in _containers()}
    t0 = time.monotonic()
    result = cluster.up(sandbox.state_dir, progress=lambda m: None)
    elapsed = time.monotonic() - t0
    assert set(result["actions"].values()) == {"adopted"}
    assert {c.name: c.id for c in _containers()} == ids_before
    # The speed budget (a few seconds) is scripts/bench_sandbox.py's figure; here only a hang fails,
    # since a loaded 2-core CI machine can take several times the budget.
    assert elapsed < 60, elapsed
    assert all(r["docker"] == "running" for r in result["ranks"])


def test_up_gives_a_rank_this_hosts_stand_in_when_its_tag_names_another(sandbox):
    """A rank whose stand-in tag names another image than this host's (as after the host rebuilt
    it under the same tag): `up` loads this host's into it, else `check`'s image row fails."""
    import docker

    tag = sandbox.images["vllm"]
    want = docker.from_env().images.get(tag).id

    def on_spark2() -> str:
        return sandbox.run("spark2", f"docker image inspect --format '{{{{.Id}}}}' {tag}")[1].strip()

    rc, other, err = sandbox.run("spark2", f"tar cf - -T /dev/null | docker import - {tag}")
    assert rc == 0, err
    try:
        assert on_spark2() == other.strip() != want
        result = cluster.up(sandbox.state_dir, progress=lambda m: None)
        assert on_spark2() == want
        assert set(result["actions"].values()) == {"adopted"}
    finally:
        sandbox.run("spark2", f"docker rmi {other.strip()} >/dev/null 2>&1; true")


def test_ring_cables_are_real_netdevs(sandbox):
    """Each rank's two fabric ports exist as 9000-MTU netdevs with the fixtures' addresses; a
    don't-fragment 9000 B ping crosses a cable; a non-neighbour's fabric IP is unreachable in
    the rank (fenced), never routed out through the management network."""
    for name in sandbox.names:
        rc, out, _ = sandbox.run(name, "ip -j addr show")
        shown = {i["ifname"]: i for i in json.loads(out)}
        for port in sandbox.truth[name]["ports"]:
            iface = shown[port["netdev"]]
            assert iface["mtu"] == 9000 and "UP" in iface["flags"]
            assert f"{port['ip']}/30" in {f"{a['local']}/{a['prefixlen']}" for a in iface["addr_info"]}
    far = sandbox.truth["spark3"]["ports"][0]["ip"]  # rank 2 is not rank 0's neighbour
    rc, out, _ = sandbox.run("spark1", "ping -n -c1 -W1 -M do -s 8972 192.168.177.2; "
                                       f"ip route get {far} 2>&1; true")
    assert "1 received" in out and "No route to host" in out, out


def test_more_ranks_and_back(sandbox):
    """`up --ranks 5` adds spark5 into the ring (spark4 -> spark5 -> spark1) and into
    cluster.yaml; `up` with the default 4 removes it and closes the 4-ring again."""
    try:
        res = sparkstack("sandbox", "up", "--ranks", "5", "--json", timeout=600)
        assert res.returncode == 0, res.stderr
        doc = json.loads(res.stdout)
        assert [r["name"] for r in doc["ranks"]] == [f"spark{i}" for i in range(1, 6)]
        assert doc["actions"]["spark5"] == "created"
        assert {doc["actions"][f"spark{i}"] for i in range(1, 5)} == {"adopted"}
        assert len(yaml.safe_load(sandbox.config.read_text())["ranks"]) == 5
        rc, out, _ = sandbox.run("spark4", "ping -n -c1 -W2 192.168.177.14")  # spark5's port 1
        assert rc == 0, out
    finally:
        res = sparkstack("sandbox", "up", "--json", timeout=600)
    assert res.returncode == 0, res.stderr
    assert [r["name"] for r in json.loads(res.stdout)["ranks"]] == sandbox.names
    assert "sparkstack-spark5" not in {c.name for c in _containers()}
    rc, out, _ = sandbox.run("spark4", "ping -n -c1 -W2 192.168.177.14")  # spark1's port 1 again
    assert rc == 0, out
    assert len(yaml.safe_load(sandbox.config.read_text())["ranks"]) == 4


def test_status_json_shape(sandbox):
    res = sparkstack("sandbox", "status", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert set(doc) == {"ranks", "config"}
    assert doc["config"] == str(sandbox.config)
    assert [r["name"] for r in doc["ranks"]] == ["spark1", "spark2", "spark3", "spark4"]
    for r in doc["ranks"]:
        assert set(r) == {"name", "address", "port", "user", "key", "docker"}
        assert r["docker"] == "running" and r["port"] == 22
        assert r["key"] == str(sandbox.key)


def test_subnet_taken_is_one_clear_message(sandbox, tmp_path):
    # docker0's 172.17.0.0/16 is routed on this host: the sandbox must refuse it, and touch nothing
    ids_before = {c.name: c.id for c in _containers()}
    res = sparkstack("sandbox", "up", "--dir", str(tmp_path / "state"),
                     env={"SPARKSTACK_SANDBOX_SUBNET": "172.17.0.0/24"})
    assert res.returncode != 0
    assert "already taken" in res.stderr and "fix:" in res.stderr
    assert "Traceback" not in res.stderr
    assert {c.name: c.id for c in _containers()} == ids_before


@restarts_ranks
def test_leftover_container_is_recreated(sandbox):
    """A rank stopped by a crash: status says so, `up` recreates it and it works again."""
    import docker

    client = docker.from_env()
    client.containers.get("sparkstack-spark4").kill()
    st = cluster.status(sandbox.state_dir)
    assert [r["docker"] for r in st["ranks"]] == ["running", "running", "running", "down"]
    result = cluster.up(sandbox.state_dir, progress=lambda m: None)
    assert result["actions"]["spark4"] == "recreated"
    assert result["actions"]["spark1"] == "adopted"
    sandbox.close()  # the old connection to spark4 is gone
    code, out, _ = sandbox.run("spark4", "hostname; docker images -q | wc -l")
    assert code == 0 and out.split()[0] == "spark4" and int(out.split()[1]) >= 1


def _containers(bare: bool = False):
    """The normal sandbox's containers (or the bare one's: `sandbox up --bare`, beside it)."""
    import docker

    return [c for c in docker.from_env().containers.list(all=True, filters={"label": f"{cluster.LABEL}=1"})
            if (c.labels.get(cluster.BARE_LABEL) == "1") == bare]


def test_ranks_report_a_spark_meminfo(sandbox):
    from launcher.sandbox import meminfo

    if not meminfo.enabled():
        pytest.skip("SPARKSTACK_SANDBOX_MEMINFO=host")
    avail = set()
    for name in sandbox.names:
        code, out, _ = sandbox.run(name, "cat /proc/meminfo")
        assert code == 0
        fields = {l.split(":")[0]: int(l.split()[1]) for l in out.splitlines()}
        assert fields["MemTotal"] == meminfo.MEMTOTAL_KB
        assert 0 < fields["MemAvailable"] < fields["MemTotal"]
        avail.add(fields["MemAvailable"])
    assert len(avail) == len(sandbox.names)


@restarts_ranks
def test_down_removes_only_its_own_then_warm_up(sandbox):
    """`down` removes the sandbox's containers, network and volumes, nothing else, within 15 s;
    `up` from cached images is back within the warm budget. (Runs last: it restarts the ranks.)"""
    import docker

    client = docker.from_env()
    foreign = client.volumes.create(f"sparkstack-foreign-{uuid.uuid4().hex[:6]}")
    foreign_net = client.networks.create(f"sparkstack-foreign-{uuid.uuid4().hex[:6]}")
    try:
        sandbox.close()
        bare = sorted(c.name for c in _containers(bare=True))  # another sandbox: left alone
        t0 = time.monotonic()
        removed = cluster.down(sandbox.state_dir)
        down_s = time.monotonic() - t0
        assert sorted(removed["containers"]) == [f"sparkstack-spark{i}" for i in range(1, 5)]
        assert removed["networks"] == [cluster.NETWORK]
        assert len(removed["volumes"]) == 4
        assert _containers() == []
        assert sorted(c.name for c in _containers(bare=True)) == bare
        client.volumes.get(foreign.name)  # still there
        client.networks.get(foreign_net.id)
        assert all(r["docker"] == "down" for r in cluster.status(sandbox.state_dir)["ranks"])
        assert down_s < 90, down_s  # budget 15 s: scripts/bench_sandbox.py measures it; only a hang fails here
        t0 = time.monotonic()
        result = cluster.up(sandbox.state_dir, progress=lambda m: None)
        up_s = time.monotonic() - t0
        assert set(result["actions"].values()) == {"created"}
        assert all(r["docker"] == "running" for r in result["ranks"])
        assert up_s < 180, f"warm up took {up_s:.0f} s (budget 30 s, measured by scripts/bench_sandbox.py)"
        code, out, _ = sandbox.run("spark2", "docker images --format '{{.Repository}}:{{.Tag}}'")
        assert sandbox.images["vllm"] in out.split()
    finally:
        foreign.remove(force=True)
        foreign_net.remove()


def test_a_ranks_containers_see_its_meminfo_and_fabric_fixtures(sandbox):
    """A container on a real Spark sees the host's /proc/meminfo and sysfs: on a sandbox rank its
    containers see the rank's GB10 meminfo and fixture tree (sandbox-runc, the rank's runtime)."""
    image = sandbox.images["vllm"]
    rc, out, err = sandbox.run("spark2", f"docker run --rm {image} sh -c "
                               "'head -1 /proc/meminfo; ls /sandbox/sysfs/class/infiniband'")
    assert rc == 0, err
    assert out.splitlines()[0].split() == ["MemTotal:", "127600000", "kB"]
    assert "rocep1s0f0" in out.split() and "roceP2p1s0f1" in out.split()
