"""The README's first bring-up on a bare sandbox (`sandbox up --bare`: cables, no fabric
addresses, no key, a password login): `init` (password once, key installed, ring discovered, an
unplugged cable reported, addresses applied, cluster.yaml written, check run) -> ship -> check
-> up. The bare sandbox is its own (containers, subnet, state dir): the shared one is untouched."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

pytestmark = pytest.mark.skipif(os.environ.get("SPARKSTACK_NO_SANDBOX") == "1", reason="needs the sandbox")


def sparkstack(*args, stdin: str = "", timeout: float = 600) -> subprocess.CompletedProcess:
    res = subprocess.run([sys.executable, "-c", "from launcher.cli.commands import main; main()", *args],
                         input=stdin, capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in res.stdout + res.stderr, res.stdout + res.stderr
    return res


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    from launcher.sandbox import cluster

    mp = pytest.MonkeyPatch()
    mp.setenv("SPARKSTACK_SANDBOX_BARE", "1")
    state = cluster.state_dir_default().resolve()
    was_up = all(r["docker"] == "running" for r in cluster.status(state)["ranks"])
    result = cluster.up(progress=lambda m: None)
    cluster.mend_cables(state)
    yield state, result
    if not was_up and os.environ.get("SPARKSTACK_SANDBOX_KEEP") != "1":  # as the sandbox fixture does
        cluster.down(state, progress=lambda m: None)
    mp.undo()


def test_init_on_a_bare_ring_then_check_and_up(bare, tmp_path):
    from launcher.sandbox import cluster

    state, result = bare
    p = cluster.paths(state)
    hosts = [r["address"] for r in result["ranks"]]
    merge = tmp_path / "sandbox.yaml"  # what only the sandbox needs: its stand-in image, its limits
    merge.write_text(yaml.safe_dump({
        "images": {"base": result["images"]["vllm"], "patches_dir": str(p["patches"])},
        "container": {"gpus": None, "devices": [], "nofile": 20000, "memlock": 8 << 20, "shm_size": "1g"}}))
    cfg = tmp_path / "cluster.yaml"
    common = ["--user", "spark", "--key", str(p["key"]), "--known-hosts", str(tmp_path / "known_hosts"),
              "--profile", "sandbox", "--model-path", cluster.MODEL_PATH, "--sysfs-root", cluster.SYSFS_ROOT,
              "--merge", str(merge), "-o", str(cfg), "--yes"]
    password = p["password"].read_text()

    # a cable left unplugged: reported by ranks and ports, before anything is configured
    cut = cluster.cut_cable(3, state)
    try:
        res = sparkstack("init", *hosts, *common, "--trust-new-hosts", "--password-stdin", "--dry-run",
                         stdin=password)
    finally:
        cluster.mend_cables(state)
    assert res.returncode == 1, res.stdout + res.stderr
    assert (f"no cable between rank 3 ({hosts[3]}) and rank 0 ({hosts[0]}): neither faces the other "
            f"(ports with no neighbour: rank 3 ({hosts[3]}) {cut.a.netdev}, rank 0 ({hosts[0]}) "
            f"{cut.b.netdev})") in res.stderr
    assert res.stderr.count("key installed (password login)") == 4
    assert "trusting new host key ssh-ed25519 SHA256:" in res.stderr
    assert not cfg.exists()

    # all cables in: the key logs in now (no password), the ring is found and addressed
    res = sparkstack("init", *hosts, *common, "--apply-network")
    out = res.stdout + res.stderr
    assert res.stderr.count("key login works") == 4, out
    for k in range(4):
        assert f"cable: rank {min(k, (k + 1) % 4)} " in out
    assert "cabled as: ring" in out and "PROBLEM" not in out
    doc = yaml.safe_load(cfg.read_text())
    assert doc["topology"] == "ring"
    assert [r["fabric_ips"] for r in doc["ranks"]] == [
        ["192.168.177.1", "192.168.177.14"], ["192.168.177.5", "192.168.177.2"],
        ["192.168.177.9", "192.168.177.6"], ["192.168.177.13", "192.168.177.10"]]
    # check ran: everything but the serving image (not shipped yet) passes or warns
    for row in ("roce", "mtu", "peers", "jumbo", "link", "checkpoint"):
        assert "FAIL rank" not in "\n".join(l for l in out.splitlines() if f" {row}:" in l), out

    ship = sparkstack("ship", "-c", str(cfg))
    assert ship.returncode == 0, ship.stdout + ship.stderr
    check = sparkstack("check", "-c", str(cfg))
    assert check.returncode == 0, check.stdout + check.stderr
    up = sparkstack("up", "-c", str(cfg))
    assert up.returncode == 0, up.stdout + up.stderr
    down = sparkstack("down", "-c", str(cfg))
    assert down.returncode == 0, down.stdout + down.stderr


def test_init_on_a_bare_switch_finds_each_ranks_switch_port(bare, tmp_path):
    """Cabled to one switch instead: every rank's one cabled port (spark3's is its second) sees
    all the others; one subnet, rank r holds host r+1."""
    from launcher.sandbox import cluster

    state, _ = bare
    result = cluster.up(cabling="switch", progress=lambda m: None)
    try:
        p = cluster.paths(state)
        hosts = [r["address"] for r in result["ranks"]]
        cfg = tmp_path / "cluster.yaml"
        res = sparkstack("init", *hosts, "--user", "spark", "--key", str(p["key"]), "--known-hosts",
                         str(tmp_path / "known_hosts"), "--trust-new-hosts", "--password-stdin",
                         "--profile", "sandbox", "--model-path", cluster.MODEL_PATH, "--sysfs-root",
                         cluster.SYSFS_ROOT, "-o", str(cfg), "--yes", "--dry-run", "--json",
                         stdin=p["password"].read_text())
        assert res.returncode == 0, res.stdout + res.stderr
        import json

        got = json.loads(res.stdout)
        assert got["cabling"] == {"topology": "switch", "cables": [], "problems": [],
                                  "switch_ports": {"0": "enp1s0f0np0", "1": "enp1s0f0np0",
                                                   "2": "enp1s0f1np1", "3": "enp1s0f0np0"}}
        assert [a["address"] for a in got["addresses"]] == [f"192.168.177.{r + 1}/24" for r in range(4)]
        assert "    enp1s0f1np1:\n      mtu: 9000\n      addresses: [192.168.177.3/24]\n" in res.stderr
        assert not cfg.exists()  # --dry-run writes nothing
    finally:
        cluster.up(cabling="ring", progress=lambda m: None)


def test_init_asks_before_trusting_a_host_key_and_prints_the_sudoers_line_it_lacks(bare, tmp_path):
    """Interactive: an unknown host key's fingerprint is shown and, refused, nothing goes further.
    A rank whose user lacks the kit's passwordless sudo gets the exact sudoers line, named."""
    import docker
    import paramiko

    from launcher.sandbox import cluster
    from launcher.transport.remote import fingerprint

    state, result = bare
    p = cluster.paths(state)
    hosts = [r["address"] for r in result["ranks"]]
    args = ["init", *hosts, "--user", "spark", "--key", str(p["key"]), "--known-hosts", str(tmp_path / "kh"),
            "--password-stdin", "--profile", "sandbox", "--model-path", cluster.MODEL_PATH,
            "--sysfs-root", cluster.SYSFS_ROOT, "-o", str(tmp_path / "cluster.yaml"), "--dry-run"]
    password = p["password"].read_text()
    res = sparkstack(*args, stdin=password + "n\n")
    host_key = paramiko.Ed25519Key.from_path(p["ranks"] / "spark1" / "ssh" / "ssh_host_ed25519_key")
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"unknown host key {fingerprint(host_key)}. Trust it?" in res.stderr
    assert f"host key {fingerprint(host_key)} not trusted" in res.stderr
    assert not (tmp_path / "kh").exists()

    rank = docker.from_env().containers.get(cluster.container_name("spark2"))
    assert rank.exec_run(["rm", "/etc/sudoers.d/spark"]).exit_code == 0
    try:
        res = sparkstack(*args, "--trust-new-hosts", "--yes", stdin=password)
    finally:
        cluster.up(progress=lambda m: None)  # the rank as before init again, its sudo back
    assert res.returncode == 0, res.stdout + res.stderr
    assert (f"rank 1 ({hosts[1]}): spark cannot run the kit's commands with `sudo -n`; add this line with "
            "`sudo visudo -f /etc/sudoers.d/sparkstack-drop-caches`:\n  spark ALL=(root) NOPASSWD: "
            "/usr/sbin/sysctl -w vm.drop_caches=3, /usr/sbin/sysctl -w vm.compact_memory=1") in res.stderr
    assert res.stderr.count("cannot run the kit's commands") == 1
